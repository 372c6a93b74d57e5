// A placement: a device type and an N-dimensional grid (hierarchy) of ranks.
//
//   Placement("cpu", {0, 1, 2, 3})            1-D mesh of 4 ranks
//   Placement("cpu", {{0, 1}, {2, 3}})        2x2 mesh
//   Placement::Parse("cpu:[[0,1],[2,3]]")     the same, from text
//
// Ranks are stored row-major: the last hierarchy axis varies fastest.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"

namespace tessel {

class Placement {
 public:
  Placement() = default;
  // Throws naming the values if ranks are empty, negative or duplicated, or
  // the hierarchy's product differs from the rank count. An empty hierarchy
  // means 1-D.
  Placement(DeviceType type, std::vector<int> ranks, std::vector<int64_t> hierarchy = {});
  Placement(std::string_view device, std::vector<int> ranks);
  // A 2-D grid, row by row (an initializer list so that {3} stays 1-D).
  Placement(std::string_view device, std::initializer_list<std::initializer_list<int>> grid);
  static Placement Parse(std::string_view text);

  DeviceType device_type() const { return rep_->type; }
  const std::vector<int>& ranks() const { return rep_->ranks; }
  const std::vector<int64_t>& hierarchy() const { return rep_->hierarchy; }
  int size() const { return static_cast<int>(rep_->ranks.size()); }
  int ndim() const { return static_cast<int>(rep_->hierarchy.size()); }
  // Placements are interned: equal values share one immutable record, so
  // copies cost a reference count, == compares pointers and caches key on
  // id(), an id no other live or past placement value has had (0: the
  // default-constructed, empty placement).
  uint64_t id() const { return rep_->id; }

  // Position of `rank` in ranks(), or -1.
  int IndexOf(int rank) const;
  bool Contains(int rank) const { return IndexOf(rank) >= 0; }
  // Whether any rank is in both.
  bool Overlaps(const Placement& other) const;
  std::vector<int64_t> Coord(int index) const;
  int IndexOfCoord(const std::vector<int64_t>& coord) const;
  // World ranks of the mesh line through `index` along `axis`, in order.
  std::vector<int> GroupAlong(int index, int axis) const;
  // Throws naming the rank if any lies outside a world of `world_size`.
  void CheckInWorld(int world_size) const;

  std::string ToString() const;  // "cpu:[[0, 1], [2, 3]]"
  bool operator==(const Placement& o) const { return rep_ == o.rep_; }
  bool operator!=(const Placement& o) const { return !(*this == o); }

 private:
  struct Rep {
    DeviceType type = DeviceType::kCPU;
    std::vector<int> ranks;
    std::vector<int64_t> hierarchy;
    uint64_t id = 0;
    // Made once per distinct placement (a world's placements hold
    // thousands of ranks, asked about per op): (rank, index) by rank, and
    // the text.
    std::vector<std::pair<int, int>> by_rank;
    std::string text;
  };
  static std::string Text(const Rep& rep);
  static std::shared_ptr<const Rep> Intern(DeviceType type, std::vector<int> ranks,
                                           std::vector<int64_t> hierarchy);
  static const std::shared_ptr<const Rep>& EmptyRep();

  std::shared_ptr<const Rep> rep_ = EmptyRep();
};

std::ostream& operator<<(std::ostream& os, const Placement& placement);

}  // namespace tessel

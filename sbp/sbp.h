// SBP: how one logical tensor is laid out over one axis of a device mesh.
//
//   S(d)  split: dimension d is cut into balanced parts, one per mesh index
//   B     broadcast: every mesh index holds the whole tensor
//   P     partial sum: every index holds a summand; the value is their sum
//   P(max) partial max: the value is the elementwise max
//
// An NdSbp has one Sbp per mesh (hierarchy) axis. Splits nest from the
// outermost mesh axis in: [S(0), S(0)] on a 2x2 mesh cuts dimension 0 in
// two, then each half in two again.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

enum class SbpType : int8_t { kSplit, kBroadcast, kPartialSum, kPartialMax };

class Sbp {
 public:
  Sbp() = default;  // B
  static Sbp Split(int axis);
  static Sbp Broadcast() { return Sbp(SbpType::kBroadcast, -1); }
  static Sbp PartialSum() { return Sbp(SbpType::kPartialSum, -1); }
  static Sbp PartialMax() { return Sbp(SbpType::kPartialMax, -1); }
  // "S(0)", "B", "P", "P(sum)", "P(max)"; throws naming the text otherwise.
  static Sbp Parse(std::string_view text);

  SbpType type() const { return type_; }
  int axis() const { return axis_; }  // split axis, -1 unless split
  bool is_split() const { return type_ == SbpType::kSplit; }
  bool is_split(int axis) const { return is_split() && axis_ == axis; }
  bool is_broadcast() const { return type_ == SbpType::kBroadcast; }
  bool is_partial() const { return type_ == SbpType::kPartialSum || type_ == SbpType::kPartialMax; }
  std::string ToString() const;

  bool operator==(const Sbp& o) const { return type_ == o.type_ && axis_ == o.axis_; }
  bool operator!=(const Sbp& o) const { return !(*this == o); }
  bool operator<(const Sbp& o) const { return type_ != o.type_ ? type_ < o.type_ : axis_ < o.axis_; }

 private:
  Sbp(SbpType type, int axis) : type_(type), axis_(axis) {}
  SbpType type_ = SbpType::kBroadcast;
  int axis_ = -1;
};

// The short forms, S(0), B(), P(), PMax(), in a namespace of their own so
// that one-letter names never collide with a user's: opt in with
// `using namespace tessel::sbp_shorthand;` (in a .cc file, not a header),
// or write Sbp::Split(0), Sbp::Broadcast(), Sbp::PartialSum().
namespace sbp_shorthand {
inline Sbp S(int axis) { return Sbp::Split(axis); }
inline Sbp B() { return Sbp::Broadcast(); }
inline Sbp P() { return Sbp::PartialSum(); }
inline Sbp PMax() { return Sbp::PartialMax(); }
}  // namespace sbp_shorthand

class NdSbp {
 public:
  NdSbp() = default;
  NdSbp(std::initializer_list<Sbp> sbps) : sbps_(sbps) {}
  explicit NdSbp(std::vector<Sbp> sbps) : sbps_(std::move(sbps)) {}
  // "[S(0), B]"; a bare "S(0)" is a 1-entry NdSbp.
  static NdSbp Parse(std::string_view text);

  int size() const { return static_cast<int>(sbps_.size()); }
  const Sbp& operator[](int i) const { return sbps_[i]; }
  Sbp& operator[](int i) { return sbps_[i]; }
  const std::vector<Sbp>& sbps() const { return sbps_; }
  bool has_partial() const;
  bool has_split(int axis) const;
  // This NdSbp with every partial entry replaced by B.
  NdSbp WithoutPartial() const;
  std::string ToString() const;

  // Throws naming the NdSbp if it has no entry per mesh axis, splits an axis
  // the tensor does not have, or mixes partial sum with partial max.
  void Check(int64_t tensor_ndim, int64_t mesh_ndim) const;

  bool operator==(const NdSbp& o) const { return sbps_ == o.sbps_; }
  bool operator!=(const NdSbp& o) const { return !(*this == o); }
  bool operator<(const NdSbp& o) const { return sbps_ < o.sbps_; }

 private:
  std::vector<Sbp> sbps_;
};

// The layout a gradient is given for a value laid out as `value`, when it
// arrives laid out as `grad`: the value's own on every axis except where the
// value is partial. Every summand of a partial value gets the whole gradient,
// so there the gradient keeps its own entry (typically B) instead of being
// made partial, which would only defer a reduction to whoever consumes it.
NdSbp GradientSbp(const NdSbp& value, const NdSbp& grad);

std::ostream& operator<<(std::ostream& os, const Sbp& sbp);
std::ostream& operator<<(std::ostream& os, const NdSbp& nd_sbp);

}  // namespace tessel

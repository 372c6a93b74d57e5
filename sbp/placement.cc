#include "sbp/placement.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/join.h"

namespace tessel {

namespace {
// The intern table: one record per live placement value. Records remove
// themselves when their last Placement goes, so a program that makes many
// placements (a fuzzer, random tests) does not grow it; ids only increase,
// so a cache entry keyed on a dead placement's id can never match a new one.
// Never destroyed: placements in static storage outlive other statics.
struct InternTable {
  std::mutex mu;
  std::map<std::tuple<DeviceType, std::vector<int64_t>, std::vector<int>>, std::weak_ptr<const void>,
           std::less<>>
      live;
  uint64_t next_id = 1;
};
InternTable& Table() {
  static auto* table = new InternTable();
  return *table;
}
}  // namespace

const std::shared_ptr<const Placement::Rep>& Placement::EmptyRep() {
  static const auto* empty = new std::shared_ptr<const Rep>([] {
    auto rep = std::make_shared<Rep>();
    rep->text = Text(*rep);
    return rep;
  }());
  return *empty;
}

std::shared_ptr<const Placement::Rep> Placement::Intern(DeviceType type, std::vector<int> ranks,
                                                        std::vector<int64_t> hierarchy) {
  InternTable& table = Table();
  auto key = std::make_tuple(type, hierarchy, ranks);
  std::lock_guard<std::mutex> lock(table.mu);
  auto it = table.live.find(key);
  if (it != table.live.end()) {
    if (auto rep = it->second.lock()) return std::static_pointer_cast<const Rep>(rep);
  }
  Rep* raw = new Rep{type, std::move(ranks), std::move(hierarchy), table.next_id++, {}, {}};
  for (size_t i = 0; i < raw->ranks.size(); ++i) raw->by_rank.emplace_back(raw->ranks[i], static_cast<int>(i));
  std::sort(raw->by_rank.begin(), raw->by_rank.end());
  raw->text = Text(*raw);
  // The deleter drops the table entry unless a new record already took it.
  std::shared_ptr<const Rep> rep(raw, [](const Rep* r) {
    InternTable& t = Table();
    {
      std::lock_guard<std::mutex> lock(t.mu);
      auto entry = t.live.find(std::tie(r->type, r->hierarchy, r->ranks));
      if (entry != t.live.end() && entry->second.expired()) t.live.erase(entry);
    }
    delete r;
  });
  table.live[std::move(key)] = rep;
  return rep;
}

Placement::Placement(DeviceType type, std::vector<int> ranks, std::vector<int64_t> hierarchy) {
  TESSEL_CHECK(!ranks.empty()) << "a placement needs at least one rank";
  if (hierarchy.empty()) hierarchy = {static_cast<int64_t>(ranks.size())};
  std::set<int> seen;
  for (int r : ranks) {
    TESSEL_CHECK(r >= 0) << "placement ranks [" << Join(ranks) << "] include negative rank " << r;
    TESSEL_CHECK(seen.insert(r).second)
        << "placement ranks [" << Join(ranks) << "] list rank " << r << " twice";
  }
  int64_t product = 1;
  bool overflow = false;  // sizes from a file or the wire can multiply past int64
  std::ostringstream dims;
  for (size_t i = 0; i < hierarchy.size(); ++i) {
    TESSEL_CHECK(hierarchy[i] > 0) << "placement hierarchy has a non-positive size " << hierarchy[i];
    overflow = overflow || __builtin_mul_overflow(product, hierarchy[i], &product);
    dims << (i ? ", " : "") << hierarchy[i];
  }
  TESSEL_CHECK(!overflow && product == static_cast<int64_t>(ranks.size()))
      << "placement hierarchy [" << dims.str() << "] has "
      << (overflow ? std::string("more than 2^63") : std::to_string(product)) << " slots but " << ranks.size()
      << " ranks were given ([" << Join(ranks) << "]); expected the product to equal the rank count";
  rep_ = Intern(type, std::move(ranks), std::move(hierarchy));
}

Placement::Placement(std::string_view device, std::vector<int> ranks)
    : Placement(ParseDeviceType(device), std::move(ranks)) {}

Placement::Placement(std::string_view device, std::initializer_list<std::initializer_list<int>> grid)
    : Placement(ParseDeviceType(device),
                [&] {
                  std::vector<int> flat;
                  for (const auto& row : grid) {
                    TESSEL_CHECK(row.size() == grid.begin()->size())
                        << "placement grid rows differ in length (" << grid.begin()->size() << " vs "
                        << row.size() << "); expected a rectangular grid";
                    flat.insert(flat.end(), row.begin(), row.end());
                  }
                  return flat;
                }(),
                {static_cast<int64_t>(grid.size()),
                 grid.size() == 0 ? 0 : static_cast<int64_t>(grid.begin()->size())}) {}

Placement Placement::Parse(std::string_view text) {
  constexpr int64_t kMaxRank = 1 << 24;
  size_t colon = text.find(':');
  TESSEL_CHECK(colon != std::string_view::npos)
      << "cannot parse placement '" << text << "'; expected DEVICE:GRID such as cpu:[[0,1],[2,3]]";
  DeviceType type = ParseDeviceType(text.substr(0, colon));
  std::string_view grid = text.substr(colon + 1);
  // Walk the nested lists: depth gives the hierarchy rank; the element
  // count of the first list at each depth gives its size.
  std::vector<int> ranks;
  std::vector<int64_t> hierarchy;
  std::vector<int64_t> counts;  // elements seen in the open list at each depth
  int depth = 0, max_depth = 0;
  bool ok = true;
  for (size_t i = 0; i < grid.size() && ok; ++i) {
    char c = grid[i];
    if (c == '[') {
      if (depth > 0) ++counts[depth - 1];
      ++depth;
      max_depth = std::max(max_depth, depth);
      if (static_cast<int>(counts.size()) < depth) counts.push_back(0);
      counts[depth - 1] = 0;
    } else if (c == ']') {
      if (depth == 0) ok = false;
      if (!ok) break;
      int64_t n = counts[depth - 1];
      if (static_cast<int>(hierarchy.size()) < depth) hierarchy.resize(depth, -1);
      if (hierarchy[depth - 1] == -1) hierarchy[depth - 1] = n;
      ok = hierarchy[depth - 1] == n;
      --depth;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      ok = depth == max_depth && depth > 0;
      if (!ok) break;
      int64_t value = 0;
      while (i < grid.size() && std::isdigit(static_cast<unsigned char>(grid[i])) && value <= kMaxRank)
        value = value * 10 + (grid[i++] - '0');
      --i;
      TESSEL_CHECK(value <= kMaxRank) << "placement '" << text << "' names a rank above " << kMaxRank;
      ranks.push_back(static_cast<int>(value));
      ++counts[depth - 1];
    } else if (c != ',' && !std::isspace(static_cast<unsigned char>(c))) {
      ok = false;
    }
  }
  TESSEL_CHECK(ok && depth == 0 && !ranks.empty())
      << "cannot parse placement '" << text << "'; expected DEVICE:GRID with a rectangular grid of ranks, "
      << "such as cpu:[0,1,2,3] or cpu:[[0,1],[2,3]]";
  return Placement(type, std::move(ranks), std::move(hierarchy));
}

bool Placement::Overlaps(const Placement& other) const {
  for (int r : ranks())
    if (other.Contains(r)) return true;
  return false;
}

int Placement::IndexOf(int rank) const {
  const auto& by_rank = rep_->by_rank;
  const auto it = std::lower_bound(by_rank.begin(), by_rank.end(), std::make_pair(rank, -1));
  return it != by_rank.end() && it->first == rank ? it->second : -1;
}

std::vector<int64_t> Placement::Coord(int index) const {
  std::vector<int64_t> coord(rep_->hierarchy.size());
  for (int64_t a = ndim() - 1; a >= 0; --a) {
    coord[a] = index % rep_->hierarchy[a];
    index /= static_cast<int>(rep_->hierarchy[a]);
  }
  return coord;
}

int Placement::IndexOfCoord(const std::vector<int64_t>& coord) const {
  int64_t index = 0;
  for (int a = 0; a < ndim(); ++a) index = index * rep_->hierarchy[a] + coord[a];
  return static_cast<int>(index);
}

std::vector<int> Placement::GroupAlong(int index, int axis) const {
  std::vector<int64_t> coord = Coord(index);
  std::vector<int> group;
  for (int64_t i = 0; i < rep_->hierarchy[axis]; ++i) {
    coord[axis] = i;
    group.push_back(rep_->ranks[IndexOfCoord(coord)]);
  }
  return group;
}

void Placement::CheckInWorld(int world_size) const {
  for (int r : rep_->ranks) {
    TESSEL_CHECK(r < world_size) << "placement " << ToString() << " names rank " << r
                                 << ", outside the world of WORLD_SIZE=" << world_size;
  }
}

std::string Placement::ToString() const { return rep_->text; }

std::string Placement::Text(const Rep& rep) {
  // Nested lists following the hierarchy: block[a] ranks make one list at depth a.
  const int64_t ndim = static_cast<int64_t>(rep.hierarchy.size());
  std::vector<int64_t> block(rep.hierarchy.size(), 1);
  for (int64_t a = ndim - 1; a >= 0; --a) block[a] = rep.hierarchy[a] * (a + 1 < ndim ? block[a + 1] : 1);
  std::ostringstream os;
  os << DeviceTypeName(rep.type) << ":";
  const int64_t size = static_cast<int64_t>(rep.ranks.size());
  for (int64_t i = 0; i < size; ++i) {
    for (int64_t a = 0; a < ndim; ++a)
      if (i % block[a] == 0) os << "[";
    os << rep.ranks[static_cast<size_t>(i)];
    for (int64_t a = ndim - 1; a >= 0; --a)
      if ((i + 1) % block[a] == 0) os << "]";
    if (i + 1 < size) os << ", ";
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Placement& placement) { return os << placement.ToString(); }

}  // namespace tessel

#include "sbp/placement.h"

#include <cctype>
#include <set>
#include <sstream>

#include "core/error.h"

namespace tessel {

namespace {
std::string JoinRanks(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}
}  // namespace

Placement::Placement(DeviceType type, std::vector<int> ranks, std::vector<int64_t> hierarchy)
    : type_(type), ranks_(std::move(ranks)), hierarchy_(std::move(hierarchy)) {
  TESSEL_CHECK(!ranks_.empty()) << "a placement needs at least one rank";
  if (hierarchy_.empty()) hierarchy_ = {static_cast<int64_t>(ranks_.size())};
  std::set<int> seen;
  for (int r : ranks_) {
    TESSEL_CHECK(r >= 0) << "placement ranks [" << JoinRanks(ranks_) << "] include negative rank " << r;
    TESSEL_CHECK(seen.insert(r).second)
        << "placement ranks [" << JoinRanks(ranks_) << "] list rank " << r << " twice";
  }
  int64_t product = 1;
  bool overflow = false;  // sizes from a file or the wire can multiply past int64
  std::ostringstream dims;
  for (size_t i = 0; i < hierarchy_.size(); ++i) {
    TESSEL_CHECK(hierarchy_[i] > 0) << "placement hierarchy has a non-positive size " << hierarchy_[i];
    overflow = overflow || __builtin_mul_overflow(product, hierarchy_[i], &product);
    dims << (i ? ", " : "") << hierarchy_[i];
  }
  TESSEL_CHECK(!overflow && product == static_cast<int64_t>(ranks_.size()))
      << "placement hierarchy [" << dims.str() << "] has "
      << (overflow ? std::string("more than 2^63") : std::to_string(product)) << " slots but "
      << ranks_.size() << " ranks were given ([" << JoinRanks(ranks_)
      << "]); expected the product to equal the rank count";
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

int Placement::IndexOf(int rank) const {
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (ranks_[i] == rank) return static_cast<int>(i);
  return -1;
}

std::vector<int64_t> Placement::Coord(int index) const {
  std::vector<int64_t> coord(hierarchy_.size());
  for (int64_t a = ndim() - 1; a >= 0; --a) {
    coord[a] = index % hierarchy_[a];
    index /= static_cast<int>(hierarchy_[a]);
  }
  return coord;
}

int Placement::IndexOfCoord(const std::vector<int64_t>& coord) const {
  int64_t index = 0;
  for (int a = 0; a < ndim(); ++a) index = index * hierarchy_[a] + coord[a];
  return static_cast<int>(index);
}

std::vector<int> Placement::GroupAlong(int index, int axis) const {
  std::vector<int64_t> coord = Coord(index);
  std::vector<int> group;
  for (int64_t i = 0; i < hierarchy_[axis]; ++i) {
    coord[axis] = i;
    group.push_back(ranks_[IndexOfCoord(coord)]);
  }
  return group;
}

void Placement::CheckInWorld(int world_size) const {
  for (int r : ranks_) {
    TESSEL_CHECK(r < world_size) << "placement " << ToString() << " names rank " << r
                                 << ", outside the world of WORLD_SIZE=" << world_size;
  }
}

std::string Placement::ToString() const {
  // Nested lists following the hierarchy: block[a] ranks make one list at depth a.
  std::vector<int64_t> block(hierarchy_.size(), 1);
  for (int64_t a = ndim() - 1; a >= 0; --a) block[a] = hierarchy_[a] * (a + 1 < ndim() ? block[a + 1] : 1);
  std::ostringstream os;
  os << DeviceTypeName(type_) << ":";
  for (int i = 0; i < size(); ++i) {
    for (int a = 0; a < ndim(); ++a)
      if (i % block[a] == 0) os << "[";
    os << ranks_[i];
    for (int a = ndim() - 1; a >= 0; --a)
      if ((i + 1) % block[a] == 0) os << "]";
    if (i + 1 < size()) os << ", ";
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Placement& placement) { return os << placement.ToString(); }

}  // namespace tessel

#include "sbp/sbp.h"

#include <cctype>
#include <charconv>

#include "core/error.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

namespace {
std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
}  // namespace

Sbp Sbp::Split(int axis) {
  TESSEL_CHECK(axis >= 0) << "S(" << axis << ") has a negative split axis; expected S(d) with d >= 0";
  return Sbp(SbpType::kSplit, axis);
}

Sbp Sbp::Parse(std::string_view raw) {
  std::string_view text = Trim(raw);
  if (text == "B") return B();
  if (text == "P" || text == "P(sum)") return P();
  if (text == "P(max)") return PMax();
  if (text.size() > 3 && text.substr(0, 2) == "S(" && text.back() == ')') {
    std::string_view digits = Trim(text.substr(2, text.size() - 3));
    int axis = -1;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), axis);
    if (ec == std::errc() && ptr == digits.data() + digits.size() && axis >= 0) return S(axis);
  }
  TESSEL_THROW(StatusCode::kInvalidArgument)
      << "cannot parse SBP '" << raw << "'; expected S(d) with d >= 0, B, P or P(max)";
}

std::string Sbp::ToString() const {
  switch (type_) {
    case SbpType::kSplit:
      return "S(" + std::to_string(axis_) + ")";
    case SbpType::kBroadcast:
      return "B";
    case SbpType::kPartialSum:
      return "P";
    case SbpType::kPartialMax:
      return "P(max)";
  }
  return "?";
}

NdSbp NdSbp::Parse(std::string_view raw) {
  std::string_view text = Trim(raw);
  if (text.empty() || text.front() != '[') return NdSbp{Sbp::Parse(text)};
  TESSEL_CHECK(text.back() == ']') << "cannot parse NdSbp '" << raw << "': missing ']'";
  std::string_view body = Trim(text.substr(1, text.size() - 2));
  std::vector<Sbp> sbps;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= body.size(); ++i) {
    if (i < body.size() && body[i] == '(') ++depth;
    if (i < body.size() && body[i] == ')') --depth;
    if (i == body.size() || (body[i] == ',' && depth == 0)) {
      TESSEL_CHECK(!Trim(body.substr(start, i - start)).empty())
          << "cannot parse NdSbp '" << raw << "': empty entry; expected e.g. [S(0), B]";
      sbps.push_back(Sbp::Parse(body.substr(start, i - start)));
      start = i + 1;
    }
  }
  return NdSbp(std::move(sbps));
}

bool NdSbp::has_partial() const {
  for (const Sbp& s : sbps_)
    if (s.is_partial()) return true;
  return false;
}

bool NdSbp::has_split(int axis) const {
  for (const Sbp& s : sbps_)
    if (s.is_split(axis)) return true;
  return false;
}

NdSbp NdSbp::WithoutPartial() const {
  NdSbp out = *this;
  for (Sbp& s : out.sbps_)
    if (s.is_partial()) s = B();
  return out;
}

std::string NdSbp::ToString() const {
  std::string out = "[";
  for (size_t i = 0; i < sbps_.size(); ++i) out += (i ? ", " : "") + sbps_[i].ToString();
  return out + "]";
}

void NdSbp::Check(int64_t tensor_ndim, int64_t mesh_ndim) const {
  TESSEL_CHECK(size() == mesh_ndim) << "NdSbp " << ToString() << " has " << size()
                                    << " entries but the placement's hierarchy has " << mesh_ndim
                                    << " axes; expected one entry per hierarchy axis";
  bool sum = false, max = false;
  for (const Sbp& s : sbps_) {
    TESSEL_CHECK(!s.is_split() || s.axis() < tensor_ndim)
        << "NdSbp " << ToString() << " splits axis " << s.axis() << " but the tensor has " << tensor_ndim
        << " dimension(s); expected split axes below " << tensor_ndim;
    sum |= s.type() == SbpType::kPartialSum;
    max |= s.type() == SbpType::kPartialMax;
  }
  TESSEL_CHECK(!(sum && max)) << "NdSbp " << ToString() << " mixes partial sum and partial max";
}

std::ostream& operator<<(std::ostream& os, const Sbp& sbp) { return os << sbp.ToString(); }
std::ostream& operator<<(std::ostream& os, const NdSbp& nd_sbp) { return os << nd_sbp.ToString(); }

NdSbp GradientSbp(const NdSbp& value, const NdSbp& grad) {
  NdSbp out = value;
  for (int a = 0; a < value.size() && a < grad.size(); ++a)
    if (value[a].is_partial()) out[a] = grad[a];
  return out;
}

}  // namespace tessel

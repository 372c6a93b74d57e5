// "0, 1, 2": the items of a list joined for an error message or a log line.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace tessel {

template <typename T>
std::string Join(const std::vector<T>& items, const char* separator = ", ") {
  std::ostringstream os;
  for (size_t i = 0; i < items.size(); ++i) os << (i ? separator : "") << items[i];
  return os.str();
}

}  // namespace tessel

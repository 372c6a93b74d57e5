// A map from name to entry that programs add to: pipeline schedules
// (runtime/pipeline_schedule.h), gradient handlers
// (layers/gradient_handler.h), parallel modes (layers/parallel_mode.h).
// Built-in entries are given to the constructor (no static registrars, so
// nothing depends on the link keeping an object file); an unknown name is
// an error that lists the registered ones. Thread-safe.
#pragma once

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/join.h"

namespace tessel {

// A name a registry (or a parallel mode's axis) may take: letters, digits,
// '_', '-' or '.', at least one.
inline bool IsRegistryName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

template <typename Entry>
class NamedRegistry {
 public:
  // `what` names an entry in messages ("pipeline schedule"); `how_to_add`
  // says how a program adds one ("runtime::RegisterSchedule").
  NamedRegistry(std::string what, std::string how_to_add, std::map<std::string, Entry> built_in)
      : what_(std::move(what)), how_to_add_(std::move(how_to_add)), entries_(std::move(built_in)) {}

  // Throws if `name` is not letters, digits, '_', '-' or '.', or is taken.
  void Add(const std::string& name, Entry entry) {
    TESSEL_CHECK(IsRegistryName(name))
        << how_to_add_ << ": name '" << name << "'; expected letters, digits, '_', '-' or '.'";
    std::lock_guard<std::mutex> lock(mu_);
    TESSEL_CHECK(entries_.emplace(name, std::move(entry)).second)
        << how_to_add_ << ": a " << what_ << " named '" << name << "' is already registered";
  }

  // The registered names, sorted.
  std::vector<std::string> Names() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> names;
    for (const auto& entry : entries_) names.push_back(entry.first);
    return names;
  }

  // The entry `name` (a copy: the lock is not held while it runs); an
  // unknown name throws "<what> 'x' is not registered; registered: a, b
  // (<also>; a program adds its own with <how_to_add>)".
  Entry Get(const std::string& name, const std::string& also = "") const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = entries_.find(name);
      if (it != entries_.end()) return it->second;
    }
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << what_ << " '" << name << "' is not registered; registered: " << Join(Names(), ", ") << " ("
        << (also.empty() ? "" : also + "; ") << "a program adds its own with " << how_to_add_ << ")";
  }

 private:
  const std::string what_, how_to_add_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace tessel

// A thread-safe map of bounded size: past `capacity` entries the least
// recently used one is evicted. For the dispatch caches (signatures, boxing
// plans), whose keys come from user layouts and shapes: a long job with
// varying shapes must not grow them without end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace tessel {

template <typename K, typename V, typename Hash = std::hash<K>>
class BoundedCache {
 public:
  explicit BoundedCache(size_t capacity) : capacity_(capacity > 0 ? capacity : 1) {}

  std::optional<V> Get(const K& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second);  // most recently used first
    return it->second->second;
  }

  void Put(const K& key, V value) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = std::move(value);
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    if (index_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++evictions_;
    }
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return index_.size();
  }
  size_t capacity() const { return capacity_; }
  uint64_t evictions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return evictions_;
  }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<K, V>> order_;
  std::unordered_map<K, typename std::list<std::pair<K, V>>::iterator, Hash> index_;
  uint64_t evictions_ = 0;
};

}  // namespace tessel

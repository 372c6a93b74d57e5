#include "core/storage.h"

namespace tessel {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  allocator_ = GetAllocator(device);
  if (bytes_ > 0) data_ = allocator_->Allocate(bytes_);
}

Storage::~Storage() {
  if (data_ != nullptr) allocator_->Free(data_, bytes_);
}

}  // namespace tessel

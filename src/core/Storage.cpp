#include "strata/core/Storage.h"

#include "strata/core/Error.h"

namespace strata {

StorageImpl::StorageImpl(size_t bytes, Allocator& allocator)
    : bytes_(bytes), device_(allocator.device()), owner_(&allocator) {
  data_ = bytes > 0 ? allocator.allocate(bytes) : nullptr;
}

StorageImpl::StorageImpl(void* data, size_t bytes, Device device)
    : data_(data), bytes_(bytes), device_(device) {}

StorageImpl::~StorageImpl() {
  releaseOwned();
}

void* StorageImpl::data() const {
  STRATA_CHECK(data_ != nullptr || bytes_ == 0,
               "storage '{}' ({} bytes) is not resident: gather its chunk first",
               label_.empty() ? std::string("<unnamed>") : label_, bytes_);
  return data_;
}

void StorageImpl::releaseOwned() {
  if (owner_ && data_) owner_->deallocate(data_);
  owner_ = nullptr;
}

void StorageImpl::repoint(void* data, Device device) {
  releaseOwned();
  data_ = data;
  device_ = device;
  ++version_;
}

void StorageImpl::evict() {
  releaseOwned();
  data_ = nullptr;
  ++version_;
}

Storage makeStorage(size_t bytes, Device device) {
  return std::make_shared<StorageImpl>(bytes, deviceAllocator(device));
}

}  // namespace strata

// What a Tensor handle points to. Three kinds share one base:
//
//   LocalTensorImpl   eager data on one device: storage + shape.
//   GlobalTensorImpl  eager global tensor: this process's shard (storage +
//                     local shape) and the layout (placement, NdSbp).
//   LazyTensorImpl    a value described by metadata only (logical shape,
//                     dtype, device, optionally placement and NdSbp) and no
//                     storage: a value a graph builder traces, or what
//                     autograd keeps of a value no gradient reads.
//
// The base holds what every kind has (the logical shape, dtype, device, the
// layout of a global value and the autograd state) so the handle's common
// accessors need no virtual call. Impls are immutable apart from the
// autograd state; handles that share an impl share that state (as
// torch.Tensor copies do).
#pragma once

#include <memory>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace tessel {

class AutogradMeta;  // graph/autograd: a tensor's place in the autograd graph
class GlobalMeta;    // sbp/global_tensor.h: placement and NdSbp
namespace ir {
class Graph;  // graph/ir: a traced graph
}

// What a lazy tensor stands for: a value of a trace (its graph and value
// id), or, with no graph, a tensor that has metadata and an identity but no
// data: one made while planning for another world (sbp/global_tensor.h:
// MetaWorldScope), which a trace reads as a variable. The identity is this
// object's: handles that share it (detach()) are one tensor.
class LazyValue {
 public:
  LazyValue(const ir::Graph* graph, int id) : graph(graph), id(id) {}
  const ir::Graph* const graph;  // null: not a traced value
  const int id;
};

enum class TensorKind : uint8_t { kLocal, kGlobal, kLazy };

class TensorImpl {
 public:
  virtual ~TensorImpl() = default;
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  TensorKind kind() const { return kind_; }
  // The logical shape (a global tensor's whole shape, not its shard's).
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  // Placement and NdSbp of a global value (eager or lazy); null if local.
  const std::shared_ptr<const GlobalMeta>& global_meta() const { return global_; }
  // Storage and local (shard) shape of an eager value; null / empty if lazy.
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  const Shape& local_shape() const { return local_shape_; }

  std::shared_ptr<AutogradMeta> autograd;  // null: no autograd state

 protected:
  TensorImpl(TensorKind kind, Shape shape, DType dtype, Device device,
             std::shared_ptr<const GlobalMeta> global, std::shared_ptr<Storage> storage, Shape local_shape)
      : kind_(kind),
        shape_(std::move(shape)),
        dtype_(dtype),
        device_(device),
        global_(std::move(global)),
        storage_(std::move(storage)),
        local_shape_(std::move(local_shape)) {}

 private:
  const TensorKind kind_;
  const Shape shape_;
  const DType dtype_;
  const Device device_;
  const std::shared_ptr<const GlobalMeta> global_;
  const std::shared_ptr<Storage> storage_;
  const Shape local_shape_;
};

class LocalTensorImpl final : public TensorImpl {
 public:
  LocalTensorImpl(std::shared_ptr<Storage> storage, Shape shape, DType dtype)
      : TensorImpl(TensorKind::kLocal, shape, dtype, storage->device(), nullptr, storage, shape) {}
};

class GlobalTensorImpl final : public TensorImpl {
 public:
  GlobalTensorImpl(std::shared_ptr<Storage> storage, Shape local_shape, Shape logical_shape, DType dtype,
                   std::shared_ptr<const GlobalMeta> meta)
      : TensorImpl(TensorKind::kGlobal, std::move(logical_shape), dtype, storage->device(), std::move(meta),
                   storage, std::move(local_shape)) {}
};

class LazyTensorImpl final : public TensorImpl {
 public:
  // `global` null: a lazy local value. `value` may be null (metadata only,
  // not part of any trace).
  LazyTensorImpl(Shape shape, DType dtype, Device device, std::shared_ptr<const GlobalMeta> global,
                 std::shared_ptr<const LazyValue> value)
      : TensorImpl(TensorKind::kLazy, std::move(shape), dtype, device, std::move(global), nullptr, Shape()),
        value_(std::move(value)) {}
  const std::shared_ptr<const LazyValue>& value() const { return value_; }

 private:
  const std::shared_ptr<const LazyValue> value_;
};

}  // namespace tessel

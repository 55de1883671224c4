// TensorFlow adapter: the BytepsPushPull, BytepsBroadcast, BytepsAllgather,
// BytepsAlltoall, BytepsReducescatter and BytepsAsyncPushPull ops.
// Kernels only turn TensorFlow tensors into the core's plain-C request (c_api.h) and
// the core's error kinds into TensorFlow's error classes; all communication lives
// in the core.
#include <string>
#include <utility>
#include <vector>

#include "../worker/c_api.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#ifdef TF_BPS_GPU_KERNELS
#include "tensorflow/core/framework/device_base.h"
#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"
#endif

namespace tf_bps {
namespace {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

bool ToCoreType(tensorflow::DataType dtype, bps_dtype* out) {
  static constexpr std::pair<tensorflow::DataType, bps_dtype> kTypes[] = {
      {tensorflow::DT_HALF, BPS_FLOAT16},   {tensorflow::DT_BFLOAT16, BPS_BFLOAT16},
      {tensorflow::DT_FLOAT, BPS_FLOAT32},  {tensorflow::DT_DOUBLE, BPS_FLOAT64},
      {tensorflow::DT_INT32, BPS_INT32},    {tensorflow::DT_INT64, BPS_INT64},
      {tensorflow::DT_UINT8, BPS_UINT8},    {tensorflow::DT_INT8, BPS_INT8},
      {tensorflow::DT_UINT16, BPS_UINT16},  {tensorflow::DT_INT16, BPS_INT16},
      {tensorflow::DT_BOOL, BPS_BOOL},
  };
  for (const auto& [framework, core] : kTypes) {
    if (framework != dtype) continue;
    *out = core;
    return true;
  }
  return false;
}

// The error class a Python user catches for each way an operation can fail.
absl::Status ToTensorFlowStatus(int kind, const char* message) {
  switch (kind) {
    case BPS_OK:
      return absl::OkStatus();
    case BPS_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(message);
    case BPS_MISMATCH:
    case BPS_SHUTDOWN:
      return absl::FailedPreconditionError(message);
    case BPS_PEER_GONE:
      return absl::UnavailableError(message);
    case BPS_ABORTED:
      return absl::AbortedError(message);
    case BPS_TIMEOUT:
      return absl::DeadlineExceededError(message);
    default:
      break;
  }
  return absl::InternalError(message);
}

// Lives from ComputeAsync until the core's completion callback.
struct InFlight {
  OpKernelContext* context;
  AsyncOpKernel::DoneCallback done;
};

void* AllocateOutput(void* ctx, int index, const long long* shape, int ndims) {
  auto* in_flight = static_cast<InFlight*>(ctx);
  tensorflow::TensorShape tensor_shape;
  for (int i = 0; i < ndims; ++i) {
    absl::Status status = tensor_shape.AddDimWithStatus(shape[i]);
    if (!status.ok()) {
      in_flight->context->SetStatus(status);
      return nullptr;
    }
  }
  Tensor* output = nullptr;
  absl::Status status = in_flight->context->allocate_output(index, tensor_shape, &output);
  if (!status.ok()) {
    in_flight->context->SetStatus(status);
    return nullptr;
  }
  static char empty;  // An empty tensor has no buffer; the core only needs a non-null one.
  return output->NumElements() ? const_cast<char*>(output->tensor_data().data()) : &empty;
}

void Finish(void* ctx, int error_kind, const char* message) {
  auto* in_flight = static_cast<InFlight*>(ctx);
  // An allocation failure has already set the more precise status.
  if (error_kind != 0 && in_flight->context->status().ok())
    in_flight->context->SetStatus(ToTensorFlowStatus(error_kind, message));
  in_flight->done();
  delete in_flight;
}

// One kernel class for every collective: only the kind and its attributes differ.
class CollectiveOp : public AsyncOpKernel {
 public:
  CollectiveOp(OpKernelConstruction* context, bps_op_kind kind)
      : AsyncOpKernel(context), kind_(kind) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
    if (context->HasAttr("process_set"))  // Asynchronous training has no process sets.
      OP_REQUIRES_OK(context, context->GetAttr("process_set", &process_set_));
    if (tensor_name_.empty()) tensor_name_ = name();
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    const Tensor& input = context->input(0);
    void* output = nullptr;  // allocated on demand for the kinds that size it late
    if (RootKeepsInput()) {
      // The root's result is its input: share the buffer instead of copying it.
      context->set_output(0, input);
      output = const_cast<char*>(input.tensor_data().data());
    } else if (OutputIsInputSized()) {
      Tensor* allocated = nullptr;
      // Reusing the input buffer is safe: a partition's result only arrives after
      // this worker's push of that partition has left its memory.
      OP_REQUIRES_OK_ASYNC(
          context, context->forward_input_or_allocate_output({0}, 0, input.shape(), &allocated),
          done);
      output = const_cast<char*>(allocated->tensor_data().data());
    }
    Enqueue(context, input, output, std::move(done));
  }

 protected:
  bool RootKeepsInput() const {
    return kind_ == BPS_BROADCAST && root_rank_ == bps_worker_rank();
  }
  bool OutputIsInputSized() const {
    return kind_ == BPS_PUSH_PULL || kind_ == BPS_BROADCAST ||
           kind_ == BPS_ASYNC_PUSH_PULL;
  }

  // The core's type of the tensor, or why it has none.
  absl::Status CoreType(const Tensor& input, bps_dtype* dtype) const {
    if (ToCoreType(input.dtype(), dtype)) return absl::OkStatus();
    return absl::InvalidArgumentError(std::string(bps_op_kind_name(kind_)) + " does not support " +
                                      tensorflow::DataTypeString(input.dtype()) + " (tensor '" +
                                      tensor_name_ + "')");
  }

  // Where the op's tensors live: host memory here; a GPU kernel names its device and
  // TensorFlow's stream instead (GpuOp).
  virtual absl::Status Place(OpKernelContext*, bps_op*) const {
    return absl::OkStatus();
  }

  // Hands `input` to the core, with the result going to `output` (or to an output the
  // core asks for once it knows the size, when null), both where Place says.
  void Enqueue(OpKernelContext* context, const Tensor& input, void* output, DoneCallback done) {
    bps_dtype dtype;
    OP_REQUIRES_OK_ASYNC(context, CoreType(input, &dtype), done);
    std::vector<long long> shape;
    for (int i = 0; i < input.dims(); ++i) shape.push_back(input.dim_size(i));
    bps_op op{};
    op.name = tensor_name_.c_str();
    op.kind = static_cast<int>(kind_);
    op.dtype = static_cast<int>(dtype);
    op.reduce_op = reduce_op_;
    op.root_rank = root_rank_;
    op.prescale = prescale_;
    op.postscale = postscale_;
    op.process_set = process_set_;
    op.compression = compression_.c_str();
    op.ndims = static_cast<int>(shape.size());
    op.shape = shape.data();
    op.input = input.tensor_data().data();
    op.output = output;
    op.bytes = input.TotalBytes();
    OP_REQUIRES_OK_ASYNC(context, Place(context, &op), done);
    std::vector<long long> splits;
    if (kind_ == BPS_ALLTOALL) {
      const Tensor& given = context->input(1);
      OP_REQUIRES_ASYNC(context, given.dims() == 1,
                        absl::InvalidArgumentError("alltoall splits must be a vector (tensor '" +
                                                   tensor_name_ + "')"),
                        done);
      auto values = given.vec<int64_t>();
      for (int64_t i = 0; i < values.size(); ++i) splits.push_back(values(i));
      op.splits = splits.data();
      op.nsplits = static_cast<int>(splits.size());
    }
    bps_enqueue(&op, AllocateOutput, Finish, new InFlight{context, std::move(done)});
  }

  // The attributes of the reductions (push_pull, reducescatter).
  void ReadReductionAttrs(OpKernelConstruction* context) {
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(context, context->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(context, context->GetAttr("postscale_factor", &postscale_));
  }

  const bps_op_kind kind_;
  std::string tensor_name_;
  int reduce_op_ = 0;
  int root_rank_ = 0;
  int process_set_ = 0;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
  std::string compression_;  // push_pull: the compressor's text ("": none)
};

class PushPullOp : public CollectiveOp {
 public:
  explicit PushPullOp(OpKernelConstruction* context)
      : CollectiveOp(context, BPS_PUSH_PULL) {
    ReadReductionAttrs(context);
    OP_REQUIRES_OK(context, context->GetAttr("compression", &compression_));
  }
};

class BroadcastOp : public CollectiveOp {
 public:
  explicit BroadcastOp(OpKernelConstruction* context)
      : CollectiveOp(context, BPS_BROADCAST) {
    OP_REQUIRES_OK(context, context->GetAttr("root_rank", &root_rank_));
  }
};

class AllgatherOp : public CollectiveOp {
 public:
  explicit AllgatherOp(OpKernelConstruction* context)
      : CollectiveOp(context, BPS_ALLGATHER) {}
};

class AlltoallOp : public CollectiveOp {
 public:
  explicit AlltoallOp(OpKernelConstruction* context)
      : CollectiveOp(context, BPS_ALLTOALL) {}
};

class ReducescatterOp : public CollectiveOp {
 public:
  explicit ReducescatterOp(OpKernelConstruction* context)
      : CollectiveOp(context, BPS_REDUCESCATTER) {
    ReadReductionAttrs(context);
  }
};

class AsyncPushPullOp : public CollectiveOp {
 public:
  explicit AsyncPushPullOp(OpKernelConstruction* context)
      : CollectiveOp(context, BPS_ASYNC_PUSH_PULL) {}
};

#ifdef TF_BPS_GPU_KERNELS
// Every op on GPU tensors: the core gets the device pointers and TensorFlow's stream.
// It waits for the kernels that computed the input through an event, stages the
// tensor through pinned host memory partition by partition on a stream of its own,
// and TensorFlow's stream waits for the output's copies; neither that stream nor a
// CUDA callback ever waits for the network (custom_ops/worker/device_staging.h).
template <typename Base>
class GpuOp : public Base {
 public:
  using Base::Base;

 protected:
  absl::Status Place(OpKernelContext* context, bps_op* op) const override {
    tensorflow::DeviceContext* device_context = context->op_device_context();
    stream_executor::Stream* stream = device_context ? device_context->stream() : nullptr;
    if (!stream)
      return absl::InternalError("no GPU stream for tensor '" + this->tensor_name_ + "'");
    op->on_device = 1;
    op->device = stream->parent()->device_ordinal();
    op->stream = stream->platform_specific_handle().stream;
    return absl::OkStatus();
  }
};
#endif  // TF_BPS_GPU_KERNELS

absl::Status SameShape(tensorflow::shape_inference::InferenceContext* c) {
  c->set_output(0, c->input(0));
  return absl::OkStatus();
}

// The input's shape with an unknown first dimension (it depends on other workers).
absl::Status OtherFirstDimension(tensorflow::shape_inference::InferenceContext* c) {
  tensorflow::shape_inference::ShapeHandle input, output;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &input));
  TF_RETURN_IF_ERROR(c->ReplaceDim(input, 0, c->UnknownDim(), &output));
  c->set_output(0, output);
  return absl::OkStatus();
}

// Every op is stateful: it talks to other processes, so TensorFlow must never fold
// it (a constant input would otherwise be evaluated once, without pushing), prune
// it or merge two identical calls into one.
REGISTER_OP("BytepsPushPull")
    .Attr("T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float32, float64}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set: int = 0")
    .Attr("reduce_op: int = 0")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("compression: string = ''")
    .Input("tensor: T")
    .Output("reduced: T")
    .SetIsStateful()
    .SetShapeFn(SameShape)
    .Doc(
        "Reduces a tensor across all tf_bps workers (reduce_op: 0 sum, 1 average, 2 min, "
        "3 max, 4 product), scaled by prescale_factor before and postscale_factor after.");

REGISTER_OP("BytepsBroadcast")
    .Attr("T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float32, float64, bool}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set: int = 0")
    .Attr("root_rank: int")
    .Input("tensor: T")
    .Output("broadcast: T")
    .SetIsStateful()
    .SetShapeFn(SameShape)
    .Doc("Every worker receives root_rank's value of the tensor.");

REGISTER_OP("BytepsAllgather")
    .Attr("T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float32, float64, bool}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set: int = 0")
    .Input("tensor: T")
    .Output("gathered: T")
    .SetIsStateful()
    .SetShapeFn(OtherFirstDimension)
    .Doc("Concatenates every worker's tensor along the first axis, in rank order.");

REGISTER_OP("BytepsAlltoall")
    .Attr("T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float32, float64, bool}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set: int = 0")
    .Input("tensor: T")
    .Input("splits: int64")
    .Output("received: T")
    .Output("received_splits: int64")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(OtherFirstDimension(c));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(
        "Sends splits[r] rows of the tensor to each rank r (an even split when splits is "
        "empty) and concatenates the rows received from every rank, in rank order.");

REGISTER_OP("BytepsReducescatter")
    .Attr("T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float32, float64}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set: int = 0")
    .Attr("reduce_op: int = 0")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Input("tensor: T")
    .Output("scattered: T")
    .SetIsStateful()
    .SetShapeFn(OtherFirstDimension)
    .Doc("Reduces the tensor across workers; each keeps its share of the first dimension.");

REGISTER_OP("BytepsAsyncPushPull")
    .Attr("T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float32, float64}")
    .Attr("tensor_name: string = ''")
    .Input("delta: T")
    .Output("parameters: T")
    .SetIsStateful()
    .SetShapeFn(SameShape)
    .Doc(
        "Asynchronous training: adds this worker's weight delta to the parameters the "
        "servers keep and returns them, without waiting for other workers. The first "
        "call on a tensor sends the initial value instead; every worker gets rank 0's.");

// The learning rate of the step whose gradients are pushed next: error feedback rescales
// what compression left out when it changes (compression/compressor.h).
class SetLearningRateOp : public tensorflow::OpKernel {
 public:
  explicit SetLearningRateOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& rate = context->input(0);
    OP_REQUIRES(context, tensorflow::TensorShapeUtils::IsScalar(rate.shape()),
                absl::InvalidArgumentError("the learning rate must be a scalar"));
    bps_set_learning_rate(rate.scalar<double>()());
  }
};

REGISTER_OP("BytepsSetLearningRate")
    .Input("learning_rate: float64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Tells the core the learning rate of the step whose gradients follow, so that "
        "compression's error feedback keeps meaning the same update when it changes.");

REGISTER_KERNEL_BUILDER(Name("BytepsSetLearningRate").Device(tensorflow::DEVICE_CPU),
                        SetLearningRateOp);
REGISTER_KERNEL_BUILDER(Name("BytepsPushPull").Device(tensorflow::DEVICE_CPU), PushPullOp);
REGISTER_KERNEL_BUILDER(Name("BytepsBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("BytepsAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("BytepsAlltoall").Device(tensorflow::DEVICE_CPU), AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("BytepsReducescatter").Device(tensorflow::DEVICE_CPU),
                        ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("BytepsAsyncPushPull").Device(tensorflow::DEVICE_CPU),
                        AsyncPushPullOp);

#ifdef TF_BPS_GPU_KERNELS
REGISTER_KERNEL_BUILDER(
    Name("BytepsSetLearningRate").Device(tensorflow::DEVICE_GPU).HostMemory("learning_rate"),
    SetLearningRateOp);
REGISTER_KERNEL_BUILDER(Name("BytepsPushPull").Device(tensorflow::DEVICE_GPU), GpuOp<PushPullOp>);
REGISTER_KERNEL_BUILDER(Name("BytepsBroadcast").Device(tensorflow::DEVICE_GPU),
                        GpuOp<BroadcastOp>);
REGISTER_KERNEL_BUILDER(Name("BytepsAsyncPushPull").Device(tensorflow::DEVICE_GPU),
                        GpuOp<AsyncPushPullOp>);
REGISTER_KERNEL_BUILDER(Name("BytepsAllgather").Device(tensorflow::DEVICE_GPU),
                        GpuOp<AllgatherOp>);
// An alltoall's splits, given and received, are a few integers: host memory.
REGISTER_KERNEL_BUILDER(Name("BytepsAlltoall")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("splits")
                            .HostMemory("received_splits"),
                        GpuOp<AlltoallOp>);
REGISTER_KERNEL_BUILDER(Name("BytepsReducescatter").Device(tensorflow::DEVICE_GPU),
                        GpuOp<ReducescatterOp>);
#endif  // TF_BPS_GPU_KERNELS

}  // namespace
}  // namespace tf_bps

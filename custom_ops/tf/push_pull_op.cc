// TensorFlow adapter: the BytepsPushPull op. It only converts TensorFlow tensors to
// the core's TensorView and hands them over; all communication lives in the core.
#include <string>
#include <vector>

#include "../core/common.h"
#include "../core/operations.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_bps {
namespace {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

bool ToCoreType(tensorflow::DataType dtype, bps::DataType* out) {
  switch (dtype) {
    case tensorflow::DT_HALF:
      *out = bps::DataType::kFloat16;
      return true;
    case tensorflow::DT_BFLOAT16:
      *out = bps::DataType::kBFloat16;
      return true;
    case tensorflow::DT_FLOAT:
      *out = bps::DataType::kFloat32;
      return true;
    case tensorflow::DT_DOUBLE:
      *out = bps::DataType::kFloat64;
      return true;
    case tensorflow::DT_INT32:
      *out = bps::DataType::kInt32;
      return true;
    case tensorflow::DT_INT64:
      *out = bps::DataType::kInt64;
      return true;
    default:
      return false;
  }
}

class PushPullOp : public AsyncOpKernel {
 public:
  explicit PushPullOp(OpKernelConstruction* context) : AsyncOpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
    int reduce_op = 0;
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op));
    reduce_op_ = reduce_op == 1 ? bps::ReduceOp::kAverage : bps::ReduceOp::kSum;
    if (tensor_name_.empty()) tensor_name_ = name();
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    const Tensor& input = context->input(0);
    bps::TensorView view;
    OP_REQUIRES_ASYNC(context, ToCoreType(input.dtype(), &view.dtype),
                      absl::InvalidArgumentError("push_pull does not support " +
                                                 tensorflow::DataTypeString(input.dtype()) +
                                                 " (tensor '" + tensor_name_ + "')"),
                      done);
    Tensor* output = nullptr;
    // Reusing the input buffer is safe: a partition's sum only arrives after this
    // worker's push of that partition has left its memory.
    OP_REQUIRES_OK_ASYNC(
        context, context->forward_input_or_allocate_output({0}, 0, input.shape(), &output), done);
    for (int i = 0; i < input.dims(); ++i) view.shape.push_back(input.dim_size(i));
    view.input = input.tensor_data().data();
    view.output = const_cast<char*>(output->tensor_data().data());
    view.bytes = input.TotalBytes();
    bps::EnqueuePushPull(view, tensor_name_, reduce_op_,
                         [context, done](const bps::Status& status) {
                           if (!status.ok())
                             context->SetStatus(absl::InternalError(status.message()));
                           done();
                         });
  }

 private:
  std::string tensor_name_;
  bps::ReduceOp reduce_op_;
};

REGISTER_OP("BytepsPushPull")
    .Attr("T: {half, bfloat16, float32, float64, int32, int64}")
    .Attr("tensor_name: string = ''")
    .Attr("reduce_op: int = 0")
    .Input("tensor: T")
    .Output("sum: T")
    // Stateful: the op talks to other processes, so TensorFlow must never fold it
    // (a constant input would otherwise be evaluated once, without pushing), prune it
    // or merge two identical calls into one.
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("Sums (reduce_op 0) or averages (reduce_op 1) a tensor across all tf_bps workers.");

REGISTER_KERNEL_BUILDER(Name("BytepsPushPull").Device(tensorflow::DEVICE_CPU), PushPullOp);

}  // namespace
}  // namespace tf_bps

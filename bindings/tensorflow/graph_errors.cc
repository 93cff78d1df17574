// RingreduceRaiseIf: passes its values through, or fails with the status code and message the
// collective's Python node returned. TensorFlow's kernel for Python ops reports any Python
// exception as InvalidArgument or Unknown; this op lets a graph collective fail with the code
// Horovod's compiled ops use (FailedPrecondition for calls that do not match across ranks).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

REGISTER_OP("RingreduceRaiseIf")
    .Input("values: T")
    .Input("code: int32")
    .Input("message: string")
    .Output("passed: T")
    .Attr("T: list(type)")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* context) {
      for (int i = 0; i < context->num_outputs(); ++i) context->set_output(i, context->input(i));
      return absl::OkStatus();
    });

class RaiseIf : public OpKernel {
 public:
  explicit RaiseIf(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const int count = context->num_inputs() - 2;
    const int32_t code = context->input(count).scalar<int32_t>()();
    if (code != 0) {
      const auto& message = context->input(count + 1).scalar<tensorflow::tstring>()();
      context->SetStatus(absl::Status(static_cast<absl::StatusCode>(code), std::string(message)));
      return;
    }
    for (int i = 0; i < count; ++i) context->set_output(i, context->input(i));
  }
};

REGISTER_KERNEL_BUILDER(Name("RingreduceRaiseIf").Device(tensorflow::DEVICE_CPU), RaiseIf);

}  // namespace

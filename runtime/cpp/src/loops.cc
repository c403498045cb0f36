// aotc.run_loop: the loop that runs an ONNX Loop's step function, as runtime/loops.py does for
// the Python runtime (see there and compiler/frontends/onnx_loop.py for the contract).
// Arguments: the VM context, the step closure, the numbers of carried values and of scan
// outputs, the trip count, the initial condition, the carried values, one empty tensor per
// scan output and the captured tensors. Runs while i < trip and cond; carried values pass from
// step to step as the VM returned them; scan elements are copied out of the VM's pool each
// step and stacked once at the end (on the host: Loop runs on CPU targets).
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/function.h>

#include <cstring>
#include <vector>

#include "aotc/model.h"

namespace aotc {
namespace {

namespace ffi = tvm::ffi;

const char* Data(const ffi::Tensor& tensor) {
  const DLTensor* dl = tensor.GetDLTensorPtr();
  return static_cast<const char*>(dl->data) + dl->byte_offset;
}

template <typename T>
ffi::Tensor Scalar(T value, DLDataType dtype) {
  ffi::Tensor out = Empty({}, dtype);
  std::memcpy(out.data_ptr(), &value, sizeof(T));
  return out;
}

template <typename T>
T Read(const ffi::Tensor& tensor) {
  if (tensor.device().device_type != kDLCPU) throw Error("aotc.run_loop: Loop runs on CPU only");
  T value;
  std::memcpy(&value, Data(tensor), sizeof(T));
  return value;
}

size_t Bytes(const ffi::Tensor& tensor) { return ffi::GetDataSize(*tensor.GetDLTensorPtr()); }

// Copies of each step's element of one scan output, joined at the end.
struct Stack {
  ffi::Tensor empty;
  std::vector<char> bytes;
  int64_t steps = 0;
  std::vector<int64_t> element_shape;

  void Add(const ffi::Tensor& element) {
    if (steps == 0) element_shape.assign(element.shape().begin(), element.shape().end());
    const char* data = Data(element);
    bytes.insert(bytes.end(), data, data + Bytes(element));
    ++steps;
  }

  ffi::Tensor Result() const {
    if (steps == 0) return empty;
    std::vector<int64_t> shape{steps};
    shape.insert(shape.end(), element_shape.begin(), element_shape.end());
    ffi::Tensor out = Empty(shape, empty.dtype());
    std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
    return out;
  }
};

void RunLoop(ffi::PackedArgs args, ffi::Any* result) {
  static const ffi::Function invoke = *ffi::Function::GetGlobal("vm.builtin.invoke_closure");
  const int kFixed = 6;  // vm, step, n_carried, n_scan, trip, cond
  if (args.size() < kFixed) throw Error("aotc.run_loop: too few arguments");
  ffi::AnyView vm = args[0], step = args[1];
  int64_t n_carried = args[2].cast<int64_t>(), n_scan = args[3].cast<int64_t>();
  int64_t trip = Read<int64_t>(args[4].cast<ffi::Tensor>());
  bool go = Read<bool>(args[5].cast<ffi::Tensor>());
  int64_t n_captured = args.size() - kFixed - n_carried - n_scan;
  if (n_captured < 0) throw Error("aotc.run_loop: fewer arguments than its counts say");
  std::vector<ffi::Any> carried;
  for (int64_t k = 0; k < n_carried; ++k) carried.push_back(args[kFixed + k]);
  std::vector<Stack> stacks(n_scan);
  for (int64_t k = 0; k < n_scan; ++k) {
    stacks[k].empty = args[kFixed + n_carried + k].cast<ffi::Tensor>();
  }
  const DLDataType int64{kDLInt, 64, 1}, boolean{kDLBool, 8, 1};
  for (int64_t i = 0; go && i < trip; ++i) {
    std::vector<ffi::AnyView> call{vm, step, ffi::AnyView()};
    ffi::Tensor index = Scalar<int64_t>(i, int64), condition = Scalar<bool>(go, boolean);
    call[2] = index;
    call.push_back(condition);
    for (const ffi::Any& value : carried) call.push_back(value);
    for (int64_t k = 0; k < n_captured; ++k) call.push_back(args[kFixed + n_carried + n_scan + k]);
    ffi::Any out;
    invoke.CallPacked(call.data(), static_cast<int32_t>(call.size()), &out);
    auto fields = out.cast<ffi::Array<ffi::Any>>();
    go = Read<bool>(fields[0].cast<ffi::Tensor>());
    for (int64_t k = 0; k < n_carried; ++k) carried[k] = fields[1 + k];
    for (int64_t k = 0; k < n_scan; ++k) stacks[k].Add(fields[1 + n_carried + k].cast<ffi::Tensor>());
  }
  ffi::Array<ffi::Any> outputs;
  for (const ffi::Any& value : carried) outputs.push_back(value);
  for (const Stack& stack : stacks) outputs.push_back(stack.Result());
  *result = outputs;
}

}  // namespace

void RegisterLoopDriver() {
  ffi::Function::SetGlobal("aotc.run_loop", ffi::Function::FromPacked(RunLoop), true);
}

}  // namespace aotc

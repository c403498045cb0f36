// aotc::Model: the Relax VM of an aotc .so, driven through tvm-ffi's C++ API.
#include <dlfcn.h>
#include <tvm/ffi/container/shape.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "aotc/model.h"
#include "encrypted.h"
#include "threads.h"

namespace aotc {
namespace {

namespace ffi = tvm::ffi;

#if defined(__aarch64__)
constexpr char kArch[] = "aarch64";
#elif defined(__x86_64__)
constexpr char kArch[] = "x86_64";
#else
constexpr char kArch[] = "unknown";
#endif

// TVM compiles kernels assuming 64-byte aligned tensors (aligned AVX-512 loads).
constexpr size_t kAlignment = 64;
// vm_initialization(device type, id, allocator, host type, id, allocator): kDLCPU = 1, pooled = 2
constexpr int kDLCPUDevice = 1;
constexpr int kPooledAllocator = 2;

// Devices a model may run on (metadata target.device), and the TVM runtime library that adds
// each one beyond the CPU (found through the runner's rpath, like libtvm_runtime).
struct DeviceInfo {
  DLDeviceType type;
  const char* runtime_library;
};
const std::map<std::string, DeviceInfo>& Devices() {
  static const std::map<std::string, DeviceInfo> devices = {
      {"cpu", {kDLCPU, nullptr}}, {"cuda", {kDLCUDA, "libtvm_runtime_cuda.so"}}};
  return devices;
}

ffi::Function Global(const char* name) {
  auto func = ffi::Function::GetGlobal(name);
  if (!func.has_value()) throw Error(std::string("TVM runtime lacks ") + name);
  return *func;
}

// A copy of `tensor` on `device` (after the copy has finished: the runtime syncs to the host).
ffi::Tensor CopyTo(const ffi::Tensor& tensor, DLDevice device, DLDevice sync_device) {
  std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  ffi::Tensor out = Global("runtime.TVMTensorAllocWithScope")(
                        ffi::Shape(shape), tensor.dtype(), device, ffi::Optional<ffi::String>())
                        .cast<ffi::Tensor>();
  Global("runtime.TVMTensorCopyFromTo")(tensor, out);
  Global("runtime.Device_StreamSync")(sync_device, nullptr);
  return out;
}

struct AlignedAlloc {
  void AllocData(DLTensor* tensor) {
    size_t bytes = ffi::GetDataSize(*tensor);
    size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    tensor->data = std::aligned_alloc(kAlignment, rounded ? rounded : kAlignment);
    if (tensor->data == nullptr) throw Error("out of memory allocating a tensor");
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

ffi::Function Get(const ffi::Module& module, const char* name, const std::string& path) {
  ffi::Optional<ffi::Function> func = module->GetFunction(name);
  if (!func.has_value()) throw Error(path + ": has no '" + name + "': not a Relax VM library");
  return *func;
}

std::string ShapeText(const ffi::ShapeView& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

std::string DTypeName(DLDataType dtype) {
  if (dtype.code == kDLBool) return "bool";
  return std::string(ffi::DLDataTypeToString(dtype));
}

ffi::Tensor Empty(const std::vector<int64_t>& shape, DLDataType dtype) {
  return ffi::Tensor::FromNDAlloc(AlignedAlloc(), ffi::ShapeView(shape.data(), shape.size()),
                                  dtype, DLDevice{kDLCPU, 0});
}

static DLDevice DeviceOf(const Metadata& meta, const std::string& path) {
  auto found = Devices().find(meta.device);
  if (found == Devices().end()) {
    throw Error(path + ": a " + meta.device + " model; this runner knows cpu and cuda");
  }
  const char* library = found->second.runtime_library;
  if (library != nullptr && dlopen(library, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    throw Error(path + ": a " + meta.device + " model needs " + library +
                " and the device driver: " + dlerror());
  }
  return DLDevice{found->second.type, 0};
}

// The flags on /proc/cpuinfo's first "flags" line; empty where it cannot be read.
static std::set<std::string> CpuFlags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  }
  return {};
}

// An AVX-512 build on an AVX2 machine would die with SIGILL at its first such instruction.
static void CheckCpuFlags(const Metadata& meta, const std::string& path) {
  if (std::string(kArch) != "x86_64" || meta.cpu_flags.empty()) return;
  std::set<std::string> have = CpuFlags();
  if (have.empty()) return;  // nothing to go by
  std::string needed, lacking;
  for (const std::string& flag : meta.cpu_flags) {
    needed += (needed.empty() ? "" : ", ") + flag;
    if (!have.count(flag)) lacking += (lacking.empty() ? "" : ", ") + flag;
  }
  if (!lacking.empty()) {
    throw Error(path + ": built for target " + meta.target_name + ", whose code uses " + needed +
                "; this CPU lacks " + lacking +
                ". Compile it for this machine (--target x86) or for a preset this CPU has");
  }
}

static ffi::Module LoadLibrary(const Metadata& meta, const std::string& path,
                               const InMemoryLibrary* memory) {
  if (meta.arch != kArch) {
    throw Error(path + ": built for " + meta.arch + " (target " + meta.target_name +
                "); this runner runs on " + kArch);
  }
  CheckCpuFlags(meta, path);
  if (memory != nullptr) return memory->Load(meta.hash);
  // dlopen searches the library path for a name without a slash: "model.so" must mean the
  // file in the current folder, as it does for every other tool.
  std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  try {
    return ffi::Module::LoadFromFile(file);
  } catch (const ffi::Error& err) {
    throw Error(path + ": TVM runtime could not load it: " + std::string(err.what()));
  }
}

void RegisterLoopDriver();  // loops.cc

static ffi::Module StartVM(const ffi::Module& lib, DLDevice device, const std::string& path) {
  RegisterLoopDriver();  // before vm_initialization, which resolves the functions a model calls
  ffi::Module vm = Get(lib, "vm_load_executable", path)().cast<ffi::Module>();
  try {
    Get(vm, "vm_initialization", path)(static_cast<int>(device.device_type), 0, kPooledAllocator,
                                       kDLCPUDevice, 0, kPooledAllocator);
  } catch (const ffi::Error& err) {
    throw Error(path + ": cannot start the device: " + std::string(err.what()));
  }
  return vm;
}

static std::shared_ptr<InMemoryLibrary> Decrypted(const std::string& path,
                                                  const std::string& key_file) {
  SetDefaultThreadCount();
  return IsEncrypted(path) ? std::make_shared<InMemoryLibrary>(path, key_file) : nullptr;
}

Model::Model(const std::string& path, bool verify, const std::string& key_file)
    : memory_(Decrypted(path, key_file)),
      meta_(memory_ ? ParseMetadata(memory_->bytes(), verify, path) : ReadMetadata(path, verify)),
      device_(DeviceOf(meta_, path)),
      lib_(LoadLibrary(meta_, path, memory_.get())),
      vm_(StartVM(lib_, device_, path)),
      main_(Get(vm_, "main", path)) {
  memory_.reset();  // the loaded library stays mapped; the memory file is closed
}

void Model::CheckInputs(const std::vector<ffi::Tensor>& inputs) const {
  if (inputs.size() != meta_.inputs.size()) {
    throw Error("the model takes " + std::to_string(meta_.inputs.size()) + " inputs, got " +
                std::to_string(inputs.size()));
  }
  std::map<std::string, int64_t> bound;  // symbolic dimension -> size seen first
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorSpec& spec = meta_.inputs[i];
    const ffi::Tensor& tensor = inputs[i];
    if (DTypeName(tensor.dtype()) != spec.dtype) {
      throw Error("input '" + spec.name + "': expected dtype " + spec.dtype + ", got " +
                  DTypeName(tensor.dtype()));
    }
    bool ok = tensor.shape().size() == spec.shape.size() && tensor.IsContiguous();
    for (size_t d = 0; ok && d < spec.shape.size(); ++d) {
      int64_t got = tensor.shape()[d];
      ok = spec.dims[d].empty() ? got == spec.shape[d]
                                : bound.emplace(spec.dims[d], got).first->second == got;
    }
    if (!ok) {
      throw Error("input '" + spec.name + "': expected shape " + spec.ToString() + ", got " +
                  ShapeText(tensor.shape()));
    }
  }
  for (const auto& [dim, size] : bound) {  // the compiler took symbolic dims to be >= 1
    if (size == 0) throw Error("dim '" + dim + "' is 0; this model takes at least 1");
  }
  for (const auto& [dim, range] : meta_.dim_ranges) {
    auto it = bound.find(dim);
    if (it != bound.end() && (it->second < range.first || it->second > range.second)) {
      throw Error("dim '" + dim + "' is " + std::to_string(it->second) + "; this model takes " +
                  std::to_string(range.first) + " to " + std::to_string(range.second));
    }
  }
}

std::vector<ffi::Tensor> Model::Run(const std::vector<ffi::Tensor>& inputs) {
  CheckInputs(inputs);
  const DLDevice host{kDLCPU, 0};
  bool on_host = device_.device_type == kDLCPU;
  std::vector<ffi::Tensor> placed;
  for (const ffi::Tensor& input : inputs) placed.push_back(on_host ? input : CopyTo(input, device_, device_));
  std::vector<ffi::AnyView> args(placed.begin(), placed.end());
  ffi::Any result;
  try {
    RunPooled([&]() {
      CallerOnFirstCore placement;
      main_.CallPacked(args.data(), static_cast<int>(args.size()), &result);
    });
  } catch (const ffi::Error& err) {
    throw Error(std::string("the model failed: ") + err.what());
  }
  std::vector<ffi::Tensor> outputs;
  if (auto tensor = result.try_cast<ffi::Tensor>()) {
    outputs.push_back(*tensor);
  } else {
    for (const ffi::Any& item : result.cast<ffi::Array<ffi::Any>>()) {
      outputs.push_back(item.cast<ffi::Tensor>());
    }
  }
  if (!on_host) {
    for (ffi::Tensor& output : outputs) output = CopyTo(output, host, device_);
  }
  return outputs;
}

}  // namespace aotc

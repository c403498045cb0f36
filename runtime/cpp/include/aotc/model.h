// aotc C++ API: load a model compiled by aotc and run it, with only libtvm_runtime and
// libtvm_ffi (no Python). The .so carries its signature and an integrity hash; both are
// checked here before the library is loaded.
//
//   aotc::Model model("model.so");
//   std::vector<tvm::ffi::Tensor> outs = model.Run({aotc::ReadNpy("input.npy")});
#ifndef AOTC_MODEL_H_
#define AOTC_MODEL_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/extra/module.h>

#include <cstdint>
#include <stdexcept>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace aotc {

// Every failure the API reports: the message names the file, input or value at fault.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One input or output of the signature. A symbolic dimension is -1 in `shape`, named in `dims`.
struct TensorSpec {
  std::string name;
  std::string dtype;                // "float32", "int64", "bool", ...
  std::vector<int64_t> shape;
  std::vector<std::string> dims;   // "" for a fixed dimension
  std::string ToString() const;
};

// The JSON block aotc embeds in the .so (see runtime/artifact.py for the format).
struct Metadata {
  std::string hash;                 // SHA-256 of the file with this field zeroed
  std::string json;                 // the whole block
  std::string target_name;
  std::string device;               // "cpu" | "cuda"
  std::string arch;                 // machine the .so was built for (x86_64, aarch64)
  std::vector<std::string> cpu_flags;  // /proc/cpuinfo flags its code uses (x86; may be empty)
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  // symbolic dimension -> [min, max] sizes the model takes (signature "dim_ranges")
  std::map<std::string, std::pair<int64_t, int64_t>> dim_ranges;
};

// Reads (and with `verify`, checks the hash of) the metadata of an aotc .so without loading it.
// An encrypted model is decrypted in memory first (its key: see Model).
Metadata ReadMetadata(const std::string& path, bool verify = true,
                      const std::string& key_file = "");

// A new CPU tensor, 64-byte aligned (TVM's kernels assume it), contents uninitialized.
tvm::ffi::Tensor Empty(const std::vector<int64_t>& shape, DLDataType dtype);
std::string DTypeName(DLDataType dtype);

class InMemoryLibrary;

class Model {
 public:
  // An encrypted model (aotc compile --encrypt-key-file) is decrypted into memory, never to
  // disk; its key comes from `key_file` (32 raw bytes or 64 hex digits) if given, else from
  // AOTC_MODEL_KEY (hex) or AOTC_MODEL_KEY_FILE. A wrong key or a changed byte is refused.
  explicit Model(const std::string& path, bool verify = true, const std::string& key_file = "");
  const Metadata& metadata() const { return meta_; }
  // Inputs in signature order; shapes and dtypes are checked against the signature first.
  std::vector<tvm::ffi::Tensor> Run(const std::vector<tvm::ffi::Tensor>& inputs);

 private:
  void CheckInputs(const std::vector<tvm::ffi::Tensor>& inputs) const;
  std::shared_ptr<InMemoryLibrary> memory_;  // an encrypted model's plaintext, while loading
  Metadata meta_;
  DLDevice device_;   // where the VM runs; inputs and outputs are copied when not the CPU
  tvm::ffi::Module lib_;
  tvm::ffi::Module vm_;
  tvm::ffi::Function main_;
};

// .npy files (format 1.0-3.0, C order, little endian).
tvm::ffi::Tensor ReadNpy(const std::string& path);
void WriteNpy(const std::string& path, const tvm::ffi::Tensor& tensor);

}  // namespace aotc

#endif  // AOTC_MODEL_H_

// Reading the metadata block aotc links into every model: "AOTC_META_V1:<sha256>:<json>\0".
// The hash covers the whole file with its 64 hex digits zeroed (runtime/artifact.py writes it).
#include <tvm/ffi/extra/json.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "aotc/model.h"
#include "encrypted.h"
#include "sha256.h"

namespace aotc {
namespace {

namespace ffi = tvm::ffi;
namespace json = tvm::ffi::json;
constexpr char kMarker[] = "AOTC_META_V1:";
constexpr size_t kHashLen = 64;

size_t LocateHash(std::string_view data, const std::string& path) {
  size_t start = data.find(kMarker);
  if (start == data.npos) {
    throw Error(path + ": no aotc metadata found: not a library built by aotc");
  }
  if (data.find(kMarker, start + 1) != data.npos) {
    throw Error(path + ": more than one aotc metadata block: file is corrupt");
  }
  return start + std::strlen(kMarker);
}

std::string Digest(std::string_view data, size_t hash_at) {
  Sha256 sha;
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  sha.Update(bytes, hash_at);
  std::string zeros(kHashLen, '0');
  sha.Update(reinterpret_cast<const uint8_t*>(zeros.data()), kHashLen);
  sha.Update(bytes + hash_at + kHashLen, data.size() - hash_at - kHashLen);
  return sha.HexDigest();
}

ffi::Any Field(const json::Object& object, const char* key, const std::string& where) {
  auto it = object.find(ffi::Any(ffi::String(key)));
  if (it == object.end()) throw Error(where + ": metadata has no '" + key + "'");
  return (*it).second;
}

std::string Text(const json::Object& object, const char* key, const std::string& where) {
  return Field(object, key, where).cast<ffi::String>();
}

TensorSpec ParseTensor(const json::Object& object, const std::string& where) {
  TensorSpec spec;
  spec.name = Text(object, "name", where);
  spec.dtype = Text(object, "dtype", where);
  for (const ffi::Any& dim : Field(object, "shape", where).cast<json::Array>()) {
    if (auto size = dim.try_cast<int64_t>()) {
      spec.shape.push_back(*size);
      spec.dims.emplace_back();
    } else {
      spec.shape.push_back(-1);
      spec.dims.push_back(dim.cast<ffi::String>());
    }
  }
  return spec;
}

std::vector<TensorSpec> ParseTensors(const json::Object& signature, const char* key,
                                     const std::string& where) {
  std::vector<TensorSpec> specs;
  for (const ffi::Any& item : Field(signature, key, where).cast<json::Array>()) {
    specs.push_back(ParseTensor(item.cast<json::Object>(), where));
  }
  return specs;
}

}  // namespace

// The whole file, read in one call (a 120 MB model: 0.1 s; istreambuf_iterator took 0.3 s).
std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(path + ": no such file or not readable");
  std::string data(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(data.data(), static_cast<std::streamsize>(data.size()))) {
    throw Error(path + ": read failed");
  }
  return data;
}

std::string TensorSpec::ToString() const {
  std::string text = name + ": " + dtype + "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? "," : "") + (dims[i].empty() ? std::to_string(shape[i]) : dims[i]);
  }
  return text + "]";
}

Metadata ReadMetadata(const std::string& path, bool verify, const std::string& key_file) {
  if (IsEncrypted(path)) {
    return ParseMetadata(InMemoryLibrary(path, key_file).bytes(), verify, path);
  }
  return ParseMetadata(ReadFile(path), verify, path);
}

Metadata ParseMetadata(std::string_view data, bool verify, const std::string& path) {
  size_t at = LocateHash(data, path);
  Metadata meta;
  meta.hash = std::string(data.substr(at, kHashLen));
  if (verify) {
    std::string actual = Digest(data, at);
    if (actual != meta.hash) {
      throw Error(path + ": integrity check failed (embedded hash " + meta.hash.substr(0, 16) +
                  "..., file hashes to " + actual.substr(0, 16) +
                  "...): the file was modified or corrupted after it was built; rebuild it");
    }
  }
  size_t begin = at + kHashLen + 1;
  size_t end = data.find('\0', begin);
  meta.json = std::string(data.substr(begin, end == data.npos ? data.npos : end - begin));
  ffi::String error;
  json::Value root = json::Parse(meta.json, &error);
  if (!error.empty()) throw Error(path + ": aotc metadata is not valid JSON: " + error.c_str());
  auto object = root.cast<json::Object>();
  auto target = Field(object, "target", path).cast<json::Object>();
  meta.target_name = Text(target, "name", path);
  // Models built before targets carried these were x86 CPU models.
  auto has = [&](const char* key) { return target.find(ffi::Any(ffi::String(key))) != target.end(); };
  meta.device = has("device") ? Text(target, "device", path) : "cpu";
  meta.arch = has("arch") ? Text(target, "arch", path) : "x86_64";
  if (has("cpu_flags")) {  // models built before the metadata listed them are not checked
    for (const ffi::Any& flag : Field(target, "cpu_flags", path).cast<json::Array>()) {
      meta.cpu_flags.push_back(std::string(flag.cast<ffi::String>()));
    }
  }
  auto signature = Field(object, "signature", path).cast<json::Object>();
  meta.inputs = ParseTensors(signature, "inputs", path);
  meta.outputs = ParseTensors(signature, "outputs", path);
  auto ranges = signature.find(ffi::Any(ffi::String("dim_ranges")));
  if (ranges != signature.end()) {
    for (const auto& [dim, bounds] : (*ranges).second.cast<json::Object>()) {
      auto pair = bounds.cast<json::Array>();
      meta.dim_ranges[dim.cast<ffi::String>()] = {pair[0].cast<int64_t>(),
                                                  pair[1].cast<int64_t>()};
    }
  }
  return meta;
}

}  // namespace aotc

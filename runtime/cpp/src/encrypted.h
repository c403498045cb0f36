// Encrypted models (runtime/encrypted.py writes them): "AOTC_ENC_V1\0", a 12-byte nonce, then
// the library sealed with AES-256-GCM and its 16-byte tag, the 12-byte header authenticated
// too. The library is decrypted into an anonymous memory file (memfd_create) and loaded from
// there: the plaintext never reaches a disk.
#ifndef AOTC_ENCRYPTED_H_
#define AOTC_ENCRYPTED_H_

#include <tvm/ffi/extra/module.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace aotc {

bool IsEncrypted(const std::string& path);

// The 32-byte key from `key_file` (32 raw bytes or 64 hex digits) if given, else from
// AOTC_MODEL_KEY (hex), else from the file AOTC_MODEL_KEY_FILE names.
std::string ReadKey(const std::string& key_file);

// The decrypted library in a memory file, for as long as this object lives. AES-GCM comes from
// OpenSSL's libcrypto, opened only when an encrypted model is loaded (so neither the runner nor
// an application linking libaotc_model needs it otherwise).
// metadata.cc: the whole file; the metadata of a library's bytes (errors name `path`).
std::string ReadFile(const std::string& path);
struct Metadata;
Metadata ParseMetadata(std::string_view data, bool verify, const std::string& path);

class InMemoryLibrary {
 public:
  InMemoryLibrary(const std::string& path, const std::string& key_file);
  ~InMemoryLibrary();
  InMemoryLibrary(const InMemoryLibrary&) = delete;
  InMemoryLibrary& operator=(const InMemoryLibrary&) = delete;

  std::string_view bytes() const { return {static_cast<const char*>(map_), size_}; }
  // dlopen it. `digest` (the library's SHA-256) names it: dlopen returns an already-loaded
  // library for a name it has seen, and a memory file's /proc path reuses descriptor numbers.
  tvm::ffi::Module Load(const std::string& digest) const;

 private:
  void Release();
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace aotc

#endif  // AOTC_ENCRYPTED_H_

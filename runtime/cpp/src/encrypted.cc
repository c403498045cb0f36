// Decrypting an encrypted aotc model into a memory file and loading it from there.
#include "encrypted.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "aotc/model.h"

namespace aotc {
namespace {

namespace ffi = tvm::ffi;

constexpr char kMagic[] = "AOTC_ENC_V1";  // with its '\0': the 12-byte header
constexpr size_t kMagicBytes = sizeof(kMagic);
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;
constexpr size_t kKeyBytes = 32;
constexpr size_t kChunk = size_t{1} << 30;  // EVP takes int lengths

// The EVP calls used here, with their C signatures in libcrypto 1.1 and 3.
struct Crypto {
  void* (*ctx_new)();
  void (*ctx_free)(void*);
  const void* (*aes_256_gcm)();
  int (*init)(void*, const void*, void*, const unsigned char*, const unsigned char*);
  int (*ctrl)(void*, int, int, void*);
  int (*update)(void*, unsigned char*, int*, const unsigned char*, int);
  int (*final)(void*, unsigned char*, int*);
};
constexpr int kSetIvLength = 0x9;  // EVP_CTRL_AEAD_SET_IVLEN
constexpr int kSetTag = 0x11;      // EVP_CTRL_AEAD_SET_TAG

template <typename F>
void Bind(void* lib, const char* name, F& slot) {
  void* symbol = dlsym(lib, name);
  if (symbol == nullptr) throw Error(std::string("OpenSSL's libcrypto lacks ") + name);
  slot = reinterpret_cast<F>(symbol);
}

const Crypto& Libcrypto() {
  static const Crypto crypto = [] {
    void* lib = nullptr;
    for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) {
      throw Error("encrypted models need OpenSSL's libcrypto (libcrypto.so.3 or .so.1.1; "
                  "Debian and Ubuntu: apt install libssl3)");
    }
    Crypto c{};
    Bind(lib, "EVP_CIPHER_CTX_new", c.ctx_new);
    Bind(lib, "EVP_CIPHER_CTX_free", c.ctx_free);
    Bind(lib, "EVP_aes_256_gcm", c.aes_256_gcm);
    Bind(lib, "EVP_DecryptInit_ex", c.init);
    Bind(lib, "EVP_CIPHER_CTX_ctrl", c.ctrl);
    Bind(lib, "EVP_DecryptUpdate", c.update);
    Bind(lib, "EVP_DecryptFinal_ex", c.final);
    return c;
  }();
  return crypto;
}

std::string ParseKey(const std::string& data, const std::string& where) {
  if (data.size() == kKeyBytes) return data;
  size_t begin = 0, end = data.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(data[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(data[end - 1]))) --end;
  std::string key;
  for (size_t i = begin; end - begin == 2 * kKeyBytes && i < end; i += 2) {
    if (!std::isxdigit(static_cast<unsigned char>(data[i])) ||
        !std::isxdigit(static_cast<unsigned char>(data[i + 1]))) {
      break;
    }
    key.push_back(static_cast<char>(std::stoi(data.substr(i, 2), nullptr, 16)));
  }
  if (key.size() != kKeyBytes) {
    throw Error(where + ": not a 256-bit key (32 raw bytes or 64 hex digits)");
  }
  return key;
}

std::string ReadKeyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read the key file " + path + ": " + std::strerror(errno));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

bool IsEncrypted(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[kMagicBytes];
  return in.read(head, kMagicBytes) && std::memcmp(head, kMagic, kMagicBytes) == 0;
}

std::string ReadKey(const std::string& key_file) {
  if (!key_file.empty()) return ParseKey(ReadKeyFile(key_file), key_file);
  const char* hex = std::getenv("AOTC_MODEL_KEY");
  if (hex != nullptr && *hex != '\0') return ParseKey(hex, "AOTC_MODEL_KEY");
  const char* file = std::getenv("AOTC_MODEL_KEY_FILE");
  if (file == nullptr || *file == '\0') {
    throw Error("the model is encrypted: give its key (a key file, AOTC_MODEL_KEY or "
                "AOTC_MODEL_KEY_FILE)");
  }
  return ParseKey(ReadKeyFile(file), file);
}

InMemoryLibrary::InMemoryLibrary(const std::string& path, const std::string& key_file)
    : path_(path) {
  const std::string sealed = ReadFile(path);
  if (sealed.size() <= kMagicBytes + kNonceBytes + kTagBytes ||
      std::memcmp(sealed.data(), kMagic, kMagicBytes) != 0) {
    throw Error(path + ": not an encrypted aotc model");
  }
  std::string key = ReadKey(key_file);
  const Crypto& c = Libcrypto();
  size_ = sealed.size() - kMagicBytes - kNonceBytes - kTagBytes;
  fd_ = memfd_create(("aotc:" + BaseName(path)).c_str(), MFD_CLOEXEC);
  if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(size_)) != 0 ||
      (map_ = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0)) == MAP_FAILED) {
    std::string reason = std::strerror(errno);
    map_ = nullptr;
    Release();
    throw Error(path + ": cannot make a memory file to decrypt into: " + reason);
  }
  const auto* header = reinterpret_cast<const unsigned char*>(sealed.data());
  const unsigned char* nonce = header + kMagicBytes;
  const unsigned char* body = nonce + kNonceBytes;
  unsigned char tag[kTagBytes], tail[kTagBytes];
  std::memcpy(tag, body + size_, kTagBytes);
  auto* out = static_cast<unsigned char*>(map_);
  const auto* key_bytes = reinterpret_cast<const unsigned char*>(key.data());
  void* ctx = c.ctx_new();
  int n = 0;
  bool ok = ctx != nullptr && c.init(ctx, c.aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
            c.ctrl(ctx, kSetIvLength, static_cast<int>(kNonceBytes), nullptr) == 1 &&
            c.init(ctx, nullptr, nullptr, key_bytes, nonce) == 1 &&
            c.update(ctx, nullptr, &n, header, static_cast<int>(kMagicBytes)) == 1;  // AAD
  for (size_t done = 0; ok && done < size_; done += kChunk) {
    int length = static_cast<int>(std::min(kChunk, size_ - done));
    ok = c.update(ctx, out + done, &n, body + done, length) == 1;
  }
  ok = ok && c.ctrl(ctx, kSetTag, static_cast<int>(kTagBytes), tag) == 1;
  bool authentic = ok && c.final(ctx, tail, &n) > 0;
  if (ctx != nullptr) c.ctx_free(ctx);
  explicit_bzero(key.data(), key.size());
  if (!authentic) {
    Release();  // the unauthenticated plaintext goes with the memory file
    throw Error(ok ? path + ": cannot decrypt: wrong key, or the file was changed"
                   : path + ": OpenSSL's libcrypto failed to set up AES-256-GCM");
  }
}

InMemoryLibrary::~InMemoryLibrary() { Release(); }

void InMemoryLibrary::Release() {
  if (map_ != nullptr) munmap(map_, size_);
  if (fd_ >= 0) close(fd_);
  map_ = nullptr;
  fd_ = -1;
}

ffi::Module InMemoryLibrary::Load(const std::string& digest) const {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/aotc-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    throw Error(path_ + ": cannot make a folder for its link: " + std::strerror(errno));
  }
  std::string link = dir + "/" + digest.substr(0, 40) + ".so";
  std::string target = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd_);
  auto cleanup = [&] {
    unlink(link.c_str());
    rmdir(dir.c_str());
  };
  if (symlink(target.c_str(), link.c_str()) != 0) {
    std::string reason = std::strerror(errno);
    cleanup();
    throw Error(path_ + ": cannot link its memory file: " + reason);
  }
  try {
    ffi::Module module = ffi::Module::LoadFromFile(link);
    cleanup();  // the library stays mapped; only a link to memory was on disk
    return module;
  } catch (const ffi::Error& err) {
    cleanup();
    throw Error(path_ + ": TVM runtime could not load it: " + std::string(err.what()));
  }
}

}  // namespace aotc

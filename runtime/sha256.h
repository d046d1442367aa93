// SHA-256 for the disk cache's keys and payload checksums: LLVM's (llvm::SHA256, already linked
// into liblfce.so), behind the small interface the cache uses.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace llvm {
class SHA256;
}

namespace lfce::runtime {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, std::size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // The digest as 64 lowercase hex digits. Call once; the object is spent afterwards.
  std::string hex_digest();

 private:
  std::unique_ptr<llvm::SHA256> hash_;
};

// sha256 of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace lfce::runtime

#include "runtime/sha256.h"

#include <llvm/ADT/ArrayRef.h>
#include <llvm/Support/SHA256.h>

#include <cstdint>

namespace lfce::runtime {

Sha256::Sha256() : hash_(std::make_unique<llvm::SHA256>()) {}
Sha256::~Sha256() = default;

void Sha256::update(const void* data, std::size_t size) {
  hash_->update(llvm::ArrayRef<std::uint8_t>(static_cast<const std::uint8_t*>(data), size));
}

std::string Sha256::hex_digest() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (std::uint8_t byte : hash_->final()) {
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  Sha256 hash;
  hash.update(data);
  return hash.hex_digest();
}

}  // namespace lfce::runtime

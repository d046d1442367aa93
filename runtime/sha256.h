// SHA-256 (FIPS 180-4), for the disk cache's keys and payload checksums. Small and
// dependency-free so that liblfce.so stays self-contained.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lfce::runtime {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // The digest as 64 lowercase hex digits. Call once; the object is spent afterwards.
  std::string hex_digest();

 private:
  void compress(const std::uint8_t* block);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

// sha256 of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace lfce::runtime

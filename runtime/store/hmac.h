// HMAC-SHA-256 (RFC 2104 over FIPS 180-4's SHA-256), for the store's handshake: each side proves it holds the
// job's token without sending it. Checked against the FIPS and RFC 4231 test vectors (tests/store_test.cc).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace hzp::runtime {

using Digest = std::array<std::uint8_t, 32>;

Digest sha256(std::string_view message);
Digest hmac_sha256(std::string_view key, std::string_view message);

// Compares in time independent of where they differ.
bool same_digest(const Digest& a, const Digest& b);

// `n` bytes from the kernel's random source (getrandom); empty if it failed.
std::string random_bytes(std::size_t n);

}  // namespace hzp::runtime

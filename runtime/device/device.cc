// What the device interface defines itself: scalar type names and conversions (numeric.h), pool piece sizes
// and the sizing pool (device.h).
#include "runtime/device/device.h"

#include <limits>

namespace hzp::runtime {

const char* to_string(ScalarType t) {
  switch (t) {
    case ScalarType::kFp32:
      return "fp32";
    case ScalarType::kBf16:
      return "bf16";
    case ScalarType::kFp16:
      return "fp16";
    case ScalarType::kFp64:
      return "fp64";
    case ScalarType::kInt32:
      return "int32";
    case ScalarType::kInt64:
      return "int64";
  }
  return "?";
}

ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::kBf16:
      return ScalarType::kBf16;
    case DType::kFp16:
      return ScalarType::kFp16;
    case DType::kFp32:
      return ScalarType::kFp32;
  }
  return ScalarType::kFp32;
}

void encode_floats(ScalarType t, const float* in, std::int64_t count, void* bytes) {
  switch (t) {
    case ScalarType::kBf16: {
      auto* out = static_cast<Bf16*>(bytes);
      for (std::int64_t i = 0; i < count; ++i) out[i] = to_bf16(in[i]);
      return;
    }
    case ScalarType::kFp16: {
      auto* out = static_cast<Fp16*>(bytes);
      for (std::int64_t i = 0; i < count; ++i) out[i] = to_fp16(in[i]);
      return;
    }
    case ScalarType::kFp64: {
      auto* out = static_cast<double*>(bytes);
      for (std::int64_t i = 0; i < count; ++i) out[i] = in[i];
      return;
    }
    default:
      std::memcpy(bytes, in, static_cast<std::size_t>(count) * sizeof(float));
  }
}

void decode_floats(ScalarType t, const void* bytes, std::int64_t count, float* out) {
  switch (t) {
    case ScalarType::kBf16: {
      const auto* in = static_cast<const Bf16*>(bytes);
      for (std::int64_t i = 0; i < count; ++i) out[i] = from_bf16(in[i]);
      return;
    }
    case ScalarType::kFp16: {
      const auto* in = static_cast<const Fp16*>(bytes);
      for (std::int64_t i = 0; i < count; ++i) out[i] = from_fp16(in[i]);
      return;
    }
    case ScalarType::kFp64: {
      const auto* in = static_cast<const double*>(bytes);
      for (std::int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(in[i]);
      return;
    }
    default:
      std::memcpy(out, bytes, static_cast<std::size_t>(count) * sizeof(float));
  }
}

std::int64_t pool_piece_bytes(std::int64_t count, ScalarType type) {
  const std::int64_t element = scalar_bytes(type);
  if (count < 0 || count > (std::numeric_limits<std::int64_t>::max() - kPoolAlignment) / element) return -1;
  return (count * element + kPoolAlignment - 1) / kPoolAlignment * kPoolAlignment;
}

Result<Buffer> SizingPool::allocate(const std::string& category, std::int64_t count, ScalarType type) {
  const std::int64_t bytes = pool_piece_bytes(count, type);
  if (bytes < 0 || bytes > std::numeric_limits<std::int64_t>::max() - used_)
    return Status::InvalidInput("memory pool: category '" + category + "' asked for an impossible size (" +
                                std::to_string(count) + " " + to_string(type) + " elements)");
  used_ += bytes;
  by_category_[category] += bytes;
  return Buffer{nullptr, count, type};
}

}  // namespace hzp::runtime

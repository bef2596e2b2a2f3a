// kernel_operator.h STUB for the compile check of qconvert's AscendC kernels (g++ -std=c++17 -fsyntax-only).
//
// Declarations only, no implementation: the types, classes and function signatures the CANN asc-devkit
// documentation gives for what the generated kernels use (basic data copy / memory management, and the
// quantization APIs of "高阶API/量化操作": AscendQuant, AscendDequant, AscendAntiQuant), as summarised in
// the project's quantization reference, section 5. A kernel that calls an overload with the wrong
// arguments, a missing template argument or a misspelt member fails to compile against it. Nothing here
// says what the APIs compute: that is qconvert/numerics/ascendc.py's emulation, and only hardware confirms
// it. The 950 parts' (`__NPU_ARCH__ == 3510`) forms replace the A2/A3 ones, as the real headers select them.
#pragma once
#include <cstdint>

// Function-type qualifiers and the global-memory address type (bisheng keywords; macros here).
#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR __gm__ uint8_t*

enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };

namespace AscendC {

// Element types the device compiler has built in (opaque here).
struct half {
  half();
  half(float value);
};
struct bfloat16_t {
  bfloat16_t();
  bfloat16_t(float value);
};
struct int4b_t;
struct fp8_e4m3fn_t;
struct fp8_e5m2_t;
struct fp8_e8m0_t;
struct hifloat8_t;
struct fp4x2_e2m1_t;
struct fp4x2_e1m2_t;

enum class TPosition { GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM };

enum class RoundMode { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD, CAST_HYBRID };

template <typename T>
class LocalTensor {
 public:
  __aicore__ LocalTensor();
  __aicore__ LocalTensor<T> operator[](const uint32_t offset) const;
  __aicore__ uint32_t GetSize() const;
  __aicore__ T GetValue(const uint32_t offset) const;
  template <typename U>
  __aicore__ LocalTensor<U> ReinterpretCast() const;
};

template <typename T>
class GlobalTensor {
 public:
  __aicore__ GlobalTensor();
  __aicore__ void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize);
  __aicore__ void SetGlobalBuffer(__gm__ T* buffer);
  __aicore__ GlobalTensor<T> operator[](const uint64_t offset) const;
};

template <TPosition pos, int32_t depth>
class TQue {
 public:
  template <typename T>
  __aicore__ LocalTensor<T> AllocTensor();
  template <typename T>
  __aicore__ bool EnQue(const LocalTensor<T>& tensor);
  template <typename T>
  __aicore__ LocalTensor<T> DeQue();
  template <typename T>
  __aicore__ void FreeTensor(LocalTensor<T>& tensor);
};

template <TPosition pos = TPosition::LCM>
class TBuf {
 public:
  template <typename T>
  __aicore__ LocalTensor<T> Get();
  template <typename T>
  __aicore__ LocalTensor<T> Get(uint32_t len);
};

class TPipe {
 public:
  __aicore__ TPipe();
  template <class T>
  __aicore__ bool InitBuffer(T& que, uint8_t num, uint32_t len);
  template <TPosition pos>
  __aicore__ bool InitBuffer(TBuf<pos>& buf, uint32_t len);
};

__aicore__ int64_t GetBlockNum();
__aicore__ int64_t GetBlockIdx();

template <pipe_t pipe>
__aicore__ void PipeBarrier();

template <typename T>
__aicore__ void DataCopy(const LocalTensor<T>& dstLocal, const GlobalTensor<T>& srcGlobal, const uint32_t calCount);
template <typename T>
__aicore__ void DataCopy(const GlobalTensor<T>& dstGlobal, const LocalTensor<T>& srcLocal, const uint32_t calCount);
template <typename T>
__aicore__ void DataCopy(const LocalTensor<T>& dstLocal, const LocalTensor<T>& srcLocal, const uint32_t calCount);

// ---------------------------------------------------------------------------------------------------
// AscendQuant
#if defined(__NPU_ARCH__) && __NPU_ARCH__ == 3510
struct AscendQuantConfig {
  bool hasOffset;
  int32_t kDim = 1;
  RoundMode roundMode = RoundMode::CAST_RINT;
};
enum class AscendQuantPolicy : int32_t {
  PER_TENSOR,
  PER_CHANNEL,
  PER_TOKEN,
  PER_GROUP,
  PER_CHANNEL_PER_GROUP,
  PER_TOKEN_PER_GROUP
};
struct AscendQuantParam {
  uint32_t m;
  uint32_t n;
  uint32_t calCount;
  uint32_t groupSize = 0;
};

// PER_TENSOR
template <typename dstT, typename srcT, bool isReuseSource = false>
__aicore__ void AscendQuant(const LocalTensor<dstT>& dstTensor, const LocalTensor<srcT>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const float scale, const float offset,
                                   const uint32_t calCount);
template <typename dstT, typename srcT, bool isReuseSource = false>
__aicore__ void AscendQuant(const LocalTensor<dstT>& dstTensor, const LocalTensor<srcT>& srcTensor,
                                   const float scale, const float offset, const uint32_t calCount);
// PER_CHANNEL, scalar offset / tensor offset
template <typename dstT, typename srcT, bool isReuseSource = false>
__aicore__ void AscendQuant(const LocalTensor<dstT>& dstTensor, const LocalTensor<srcT>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const LocalTensor<srcT>& scaleTensor,
                                   const srcT offset, const uint32_t scaleCount, const uint32_t calCount);
template <typename dstT, typename srcT, bool isReuseSource = false>
__aicore__ void AscendQuant(const LocalTensor<dstT>& dstTensor, const LocalTensor<srcT>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const LocalTensor<srcT>& scaleTensor,
                                   const LocalTensor<srcT>& offsetTensor, const uint32_t scaleCount,
                                   const uint32_t offsetCount, const uint32_t calCount);
// PER_TOKEN / PER_GROUP
template <typename dstT, typename srcT, typename scaleT, bool isReuseSource, const AscendQuantConfig& config,
          const AscendQuantPolicy& policy>
__aicore__ void AscendQuant(const LocalTensor<dstT>& dstTensor, const LocalTensor<srcT>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const LocalTensor<scaleT>& scaleTensor,
                                   const LocalTensor<scaleT>& offsetTensor, const AscendQuantParam& para);
template <typename dstT, typename srcT, typename scaleT, bool isReuseSource, const AscendQuantConfig& config,
          const AscendQuantPolicy& policy>
__aicore__ void AscendQuant(const LocalTensor<dstT>& dstTensor, const LocalTensor<srcT>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const LocalTensor<scaleT>& scaleTensor,
                                   const scaleT offset, const AscendQuantParam& para);
#else
struct AscendQuantConfig {
  uint32_t calcCount = 0;
  uint32_t offsetCount = 0;
  uint32_t scaleCount = 0;
  uint32_t workLocalSize = 0;
};
constexpr AscendQuantConfig ASCEND_QUANT_DEFAULT_CFG = {0, 0, 0, 0};

// PER_TENSOR
template <typename T, bool isReuseSource = false, const AscendQuantConfig& config = ASCEND_QUANT_DEFAULT_CFG>
__aicore__ void AscendQuant(const LocalTensor<int8_t>& dstTensor, const LocalTensor<T>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const float scale, const float offset,
                                   const uint32_t calCount);
template <typename T, bool isReuseSource = false, const AscendQuantConfig& config = ASCEND_QUANT_DEFAULT_CFG>
__aicore__ void AscendQuant(const LocalTensor<int8_t>& dstTensor, const LocalTensor<T>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const float scale, const float offset);
template <typename T, bool isReuseSource = false, const AscendQuantConfig& config = ASCEND_QUANT_DEFAULT_CFG>
__aicore__ void AscendQuant(const LocalTensor<int8_t>& dstTensor, const LocalTensor<T>& srcTensor,
                                   const float scale, const float offset, const uint32_t calCount);
// PER_CHANNEL, scalar offset
template <typename T, bool isReuseSource = false, const AscendQuantConfig& config = ASCEND_QUANT_DEFAULT_CFG>
__aicore__ void AscendQuant(const LocalTensor<int8_t>& dstTensor, const LocalTensor<T>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const LocalTensor<T>& scaleTensor,
                                   const T offset, const uint32_t scaleCount, const uint32_t calCount);
// PER_CHANNEL, tensor offset
template <typename T, bool isReuseSource = false, const AscendQuantConfig& config = ASCEND_QUANT_DEFAULT_CFG>
__aicore__ void AscendQuant(const LocalTensor<int8_t>& dstTensor, const LocalTensor<T>& srcTensor,
                                   const LocalTensor<uint8_t>& sharedTmpBuffer, const LocalTensor<T>& scaleTensor,
                                   const LocalTensor<T>& offsetTensor, const uint32_t scaleCount,
                                   const uint32_t offsetCount, const uint32_t calCount);
template <typename T, bool isReuseSource = false, const AscendQuantConfig& config = ASCEND_QUANT_DEFAULT_CFG>
__aicore__ void AscendQuant(const LocalTensor<int8_t>& dstTensor, const LocalTensor<T>& srcTensor,
                                   const LocalTensor<T>& scaleTensor, const LocalTensor<T>& offsetTensor,
                                   const uint32_t scaleCount, const uint32_t offsetCount, const uint32_t calCount);
#endif

// ---------------------------------------------------------------------------------------------------
// AscendDequant
enum class DeQuantMode { DEQUANT_WITH_SINGLE_ROW, DEQUANT_WITH_MULTI_ROW };
struct DequantParams {
  uint32_t m;
  uint32_t n;
  uint32_t calCount;
};
template <typename dstT, typename scaleT, DeQuantMode mode = DeQuantMode::DEQUANT_WITH_SINGLE_ROW>
__aicore__ void AscendDequant(const LocalTensor<dstT>& dstTensor, const LocalTensor<int32_t>& srcTensor,
                                     const LocalTensor<scaleT>& deqScale, const LocalTensor<uint8_t>& sharedTmpBuffer,
                                     DequantParams params);
template <typename dstT, typename scaleT, DeQuantMode mode = DeQuantMode::DEQUANT_WITH_SINGLE_ROW>
__aicore__ void AscendDequant(const LocalTensor<dstT>& dstTensor, const LocalTensor<int32_t>& srcTensor,
                                     const LocalTensor<scaleT>& deqScale, DequantParams params);
template <typename dstT, typename scaleT, DeQuantMode mode = DeQuantMode::DEQUANT_WITH_SINGLE_ROW>
__aicore__ void AscendDequant(const LocalTensor<dstT>& dstTensor, const LocalTensor<int32_t>& srcTensor,
                                     const scaleT deqScale, const LocalTensor<uint8_t>& sharedTmpBuffer,
                                     DequantParams params);

// ---------------------------------------------------------------------------------------------------
// AscendAntiQuant
struct AntiQuantShapeInfo {
  uint32_t offsetHeight{0};
  uint32_t offsetWidth{0};
  uint32_t scaleHeight{0};
  uint32_t scaleWidth{0};
};
template <typename InputDataType, typename OutputDataType, bool isTranspose>
__aicore__ void AscendAntiQuant(const LocalTensor<OutputDataType>& dst, const LocalTensor<InputDataType>& src,
                                       const LocalTensor<OutputDataType>& offset,
                                       const LocalTensor<OutputDataType>& scale,
                                       const LocalTensor<uint8_t>& sharedTmpBuffer, const uint32_t k,
                                       const AntiQuantShapeInfo& shapeInfo = {});
template <typename InputDataType, typename OutputDataType, bool isTranspose>
__aicore__ void AscendAntiQuant(const LocalTensor<OutputDataType>& dst, const LocalTensor<InputDataType>& src,
                                       const LocalTensor<OutputDataType>& offset,
                                       const LocalTensor<OutputDataType>& scale, const uint32_t k,
                                       const AntiQuantShapeInfo& shapeInfo = {});
template <typename InputDataType, typename OutputDataType, bool isTranspose>
__aicore__ void AscendAntiQuant(const LocalTensor<OutputDataType>& dst, const LocalTensor<InputDataType>& src,
                                       const OutputDataType offset, const OutputDataType scale,
                                       const LocalTensor<uint8_t>& sharedTmpBuffer, const uint32_t k,
                                       const AntiQuantShapeInfo& shapeInfo = {});
template <typename InputDataType, typename OutputDataType, bool isTranspose>
__aicore__ void AscendAntiQuant(const LocalTensor<OutputDataType>& dst, const LocalTensor<InputDataType>& src,
                                       const OutputDataType offset, const OutputDataType scale, const uint32_t k,
                                       const AntiQuantShapeInfo& shapeInfo = {});

}  // namespace AscendC

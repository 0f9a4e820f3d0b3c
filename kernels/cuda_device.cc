#include "kernels/cuda_device.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda_check.h"
#include "kernels/gpu_executor.h"
#include "kernels/reduce_kernels.h"

namespace stragg::gpu {
namespace {

class CudaDevice final : public Device {
 public:
  const char* name() const override { return "cuda"; }

  int current_device() override {
    int d = 0;
    cuda_check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  void set_current_device(int device) override {
    cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }

  Stream create_stream() override {
    cudaStream_t s = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroy_stream(Stream s) noexcept override { cudaStreamDestroy(s); }

  Event create_event() override {
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroy_event(Event e) noexcept override { cudaEventDestroy(e); }
  void record(Event e, Stream s) override { cuda_check(cudaEventRecord(e, s), "cudaEventRecord"); }
  void wait_event(Stream s, Event e) override {
    cuda_check(cudaStreamWaitEvent(s, e, 0), "cudaStreamWaitEvent");
  }
  bool query(Event e) override {
    const cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaSuccess) return true;
    if (rc == cudaErrorNotReady) return false;
    cuda_check(rc, "cudaEventQuery");
    return false;
  }

  void* alloc_async(size_t bytes, Stream s) override {
    void* p = nullptr;
    cuda_check(cudaMallocAsync(&p, bytes, s),
               "cudaMallocAsync of " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free_async(void* p, Stream s) noexcept override { cudaFreeAsync(p, s); }

  void copy_async(void* dst, const void* src, size_t bytes, Stream s) override {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s),
               "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes");
  }

  void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count,
                   Stream s) override {
    gpu::reduce_into(t, op, dst, src, count, s);
  }
  void scale(DType t, void* buf, size_t count, double factor, Stream s) override {
    gpu::scale(t, buf, count, factor, s);
  }
  void divide(DType t, void* buf, size_t count, int64_t divisor, Stream s) override {
    gpu::divide(t, buf, count, divisor, s);
  }
};

}  // namespace

Device& cuda_device() {
  static CudaDevice device;
  return device;
}

GpuExecutor::GpuExecutor(GpuP2P& p2p) : GpuExecutor(p2p, cuda_device()) {}

}  // namespace stragg::gpu

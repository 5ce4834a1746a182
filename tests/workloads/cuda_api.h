// The slice of the CUDA runtime and NCCL C APIs the GPU workloads call, declared here because
// the test machines have NVIDIA's libraries (from PyPI) but not their headers. Layouts and
// values follow cuda_runtime_api.h and nccl.h (CUDA 12, NCCL 2.x, 64-bit).
#pragma once
#include <stddef.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef struct { unsigned x, y, z; } dim3;
enum { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
       cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
struct cudaPos { size_t x, y, z; };
struct cudaPitchedPtr { void *ptr; size_t pitch, xsize, ysize; };
struct cudaExtent { size_t width, height, depth; };
struct cudaMemcpy3DParms {
    void *srcArray; struct cudaPos srcPos; struct cudaPitchedPtr srcPtr;
    void *dstArray; struct cudaPos dstPos; struct cudaPitchedPtr dstPtr;
    struct cudaExtent extent; int kind;
};

cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t stream);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, int kind);
cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms *p);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;
enum { ncclInt8 = 0, ncclInt32 = 2, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8 };
enum { ncclSum = 0 };
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, int datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, int datatype, int op,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *send, size_t count, int datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recv, size_t count, int datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

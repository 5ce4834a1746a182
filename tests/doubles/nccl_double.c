// TEST DOUBLE of NCCL (libnccl.so.2): see README.md. Not NVIDIA code.
#include <stdlib.h>

#include "../workloads/cuda_api.h"

struct ncclComm { int nranks, rank; };

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    *comm = malloc(sizeof **comm);
    (*comm)->nranks = nranks;
    (*comm)->rank = rank;
    return 0;
}
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op, ncclComm_t c, cudaStream_t st) {
    (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st;
    return 0;
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int t, int root, ncclComm_t c, cudaStream_t st) {
    (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st;
    return 0;
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int t, ncclComm_t c, cudaStream_t st) {
    (void)s; (void)r; (void)n; (void)t; (void)c; (void)st;
    return 0;
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, ncclComm_t c, cudaStream_t st) {
    (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st;
    return 0;
}
ncclResult_t ncclSend(const void *s, size_t n, int t, int peer, ncclComm_t c, cudaStream_t st) {
    (void)s; (void)n; (void)t; (void)peer; (void)c; (void)st;
    return 0;
}
ncclResult_t ncclRecv(void *r, size_t n, int t, int peer, ncclComm_t c, cudaStream_t st) {
    (void)r; (void)n; (void)t; (void)peer; (void)c; (void)st;
    return 0;
}
ncclResult_t ncclGroupStart(void) { return 0; }
ncclResult_t ncclGroupEnd(void) { return 0; }

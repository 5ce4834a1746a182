// TEST DOUBLE of NVML (libnvidia-ml.so.1): see README.md. Not NVIDIA code.
//
// Two scripted GPUs joined by 4 NVLinks: GPU 0 busy (85% SM, 60 GiB used, software power cap
// throttling, 2 and 4 GB/s of PCIe), GPU 1 nearly idle (2% SM, 4 GiB used). The process named
// by NVML_DOUBLE_PID (if set) holds 10 GiB on GPU 0. NVML_DOUBLE_LOG, if set, names a file
// where each poll of GPU 0's utilization appends a line (the test reads the cadence from it).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum { OK = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7 };

struct device {
    int index;
    const char *name, *uuid, *bus;
    unsigned sm, mem, power_mw, sm_clock, mem_clock, temp, tx_kbs, rx_kbs;
    unsigned long long used, throttle;
};
static struct device devices[2] = {
    {0, "Test Double GPU", "GPU-double-0", "00000000:17:00.0", 85, 40, 300000, 1980, 2619, 65, 2000000,
     4000000, 60ULL << 30, 0x4},
    {1, "Test Double GPU", "GPU-double-1", "00000000:65:00.0", 2, 1, 80000, 345, 2619, 35, 1000, 1000,
     4ULL << 30, 0x1},
};
static const unsigned long long total = 80ULL << 30;

typedef struct { unsigned gpu, memory; } utilization_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } memory_v2_t;
typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } process_t;

static struct device *dev(void *handle) { return (struct device *)handle; }

nvmlReturn_t nvmlInit_v2(void) { return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == OK ? "Success" : "Not Supported"; }
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    snprintf(version, length, "550.00");
    return OK;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) { *count = 2; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle) {
    if (index > 1) return INVALID_ARGUMENT;
    *handle = &devices[index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(void *d, char *name, unsigned length) {
    snprintf(name, length, "%s %d", dev(d)->name, dev(d)->index);
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(void *d, char *uuid, unsigned length) {
    snprintf(uuid, length, "%s", dev(d)->uuid);
    return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *d, pci_t *pci) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", dev(d)->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", dev(d)->bus + 4);
    pci->bus = dev(d)->index ? 0x65 : 0x17;
    return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *d, utilization_t *u) {
    u->gpu = dev(d)->sm;
    u->memory = dev(d)->mem;
    const char *log = getenv("NVML_DOUBLE_LOG");
    if (log && dev(d)->index == 0) {
        FILE *f = fopen(log, "a");
        if (f) {
            fputs("poll\n", f);
            fclose(f);
        }
    }
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *d, memory_v2_t *m) {
    m->total = total;
    m->reserved = 0;
    m->used = dev(d)->used;
    m->free = total - dev(d)->used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(void *d, unsigned *mw) { *mw = dev(d)->power_mw; return OK; }
nvmlReturn_t nvmlDeviceGetClockInfo(void *d, int type, unsigned *mhz) {
    *mhz = type == 2 ? dev(d)->mem_clock : dev(d)->sm_clock;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(void *d, int sensor, unsigned *c) { (void)sensor; *c = dev(d)->temp; return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *d, unsigned long long *r) { *r = dev(d)->throttle; return OK; }
nvmlReturn_t nvmlDeviceGetPcieThroughput(void *d, int counter, unsigned *kbs) {
    *kbs = counter == 0 ? dev(d)->tx_kbs : dev(d)->rx_kbs;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *d, unsigned *g) { (void)d; *g = 4; return OK; }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *d, unsigned *w) { (void)d; *w = 16; return OK; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(void *d, unsigned *g) { (void)d; *g = 5; return OK; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(void *d, unsigned *w) { (void)d; *w = 16; return OK; }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned *count, process_t *infos) {
    const char *pid = getenv("NVML_DOUBLE_PID");
    unsigned n = (pid && dev(d)->index == 0) ? 1 : 0;
    if (infos == NULL || *count < n) {
        *count = n;
        return n ? INSUFFICIENT_SIZE : OK;
    }
    *count = n;
    if (n) {
        memset(infos, 0, sizeof *infos);
        infos[0].pid = (unsigned)atoi(pid);
        infos[0].usedGpuMemory = 10ULL << 30;
    }
    return OK;
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(void *a, void *b, int *level) {
    (void)a; (void)b;
    *level = 50; // NVML_TOPOLOGY_SYSTEM
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(void *d, unsigned link, int *active) { (void)d; *active = link < 4; return OK; }
nvmlReturn_t nvmlDeviceGetNvLinkVersion(void *d, unsigned link, unsigned *v) { (void)d; (void)link; *v = 4; return OK; }
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *d, unsigned link, pci_t *pci) {
    (void)link;
    return nvmlDeviceGetPciInfo_v3(&devices[1 - dev(d)->index], pci);
}
nvmlReturn_t nvmlDeviceGetFieldValues(void *d, int count, void *values) {
    (void)d; (void)count; (void)values;
    return NOT_SUPPORTED;
}

/* A stand-in for the NVIDIA driver library (libcuda.so.1) on machines without one.
 *
 * Mooncake's wheel links libcuda.so.1 directly, so its Python modules cannot even be imported
 * without it, although the TCP transport never calls the GPU. scripts/bootstrap compiles this file
 * only when the system has no libcuda.so.1; every entry point answers CUDA_ERROR_NO_DEVICE (100).
 * The list is what Mooncake 0.3.13's store.so and engine.so import from libcuda
 * (`nm -D --undefined-only store.so | grep ' cu'`), plus the two calls a "is there a GPU" probe makes.
 */
#define CUDA_ERROR_NO_DEVICE 100

int cuGetErrorName(int error, const char **name) {
    (void)error;
    *name = "CUDA_ERROR_NO_DEVICE";
    return 0;
}

int cuGetErrorString(int error, const char **text) {
    (void)error;
    *text = "no CUDA driver on this machine (rollout-serve stand-in libcuda.so.1)";
    return 0;
}

#define NO_DEVICE(name) int name(void) { return CUDA_ERROR_NO_DEVICE; }
NO_DEVICE(cuInit)
NO_DEVICE(cuDriverGetVersion)
NO_DEVICE(cuDeviceGetCount)
NO_DEVICE(cuDeviceGet)
NO_DEVICE(cuDeviceGetAttribute)
NO_DEVICE(cuDevicePrimaryCtxRetain)
NO_DEVICE(cuDevicePrimaryCtxRelease_v2)
NO_DEVICE(cuCtxGetDevice)
NO_DEVICE(cuCtxSetCurrent)
NO_DEVICE(cuMemAddressFree)
NO_DEVICE(cuMemAddressReserve)
NO_DEVICE(cuMemCreate)
NO_DEVICE(cuMemExportToShareableHandle)
NO_DEVICE(cuMemGetAddressRange_v2)
NO_DEVICE(cuMemGetAllocationGranularity)
NO_DEVICE(cuMemGetHandleForAddressRange)
NO_DEVICE(cuMemImportFromShareableHandle)
NO_DEVICE(cuMemMap)
NO_DEVICE(cuMemRelease)
NO_DEVICE(cuMemSetAccess)
NO_DEVICE(cuMemUnmap)
NO_DEVICE(cuPointerGetAttribute)
NO_DEVICE(cuPointerSetAttribute)

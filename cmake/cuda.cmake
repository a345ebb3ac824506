# The one list of CUDA architectures kiln supports (shared/DESIGN.md section 2).
# Elsewhere an SM number appears only where the CUDA backend picks a kernel for the device
# (kernels/*_sm120*, quant_gemm.cu, sampling.cu, mma_peak.cu, pdl.cuh, selftest.cpp).
#   80, 86, 89: Ampere / Ada (portable mma.sync path, 99 KiB smem per block on 86/89)
#   90:         Hopper, the test GPU (runs the portable path under --smem-cap 101376)
#   120a, 121a: consumer Blackwell RTX 50 / PRO 6000, and DGX Spark (arch-specific
#               cubins: sm_120a cubins do not load on sm_121)
set(KILN_CUDA_ARCHS_SUPPORTED 80 86 89 90 120a 121a)
set(KILN_CUDA_ARCHS "${KILN_CUDA_ARCHS_SUPPORTED}" CACHE STRING
    "CUDA architectures to build, a subset of: ${KILN_CUDA_ARCHS_SUPPORTED}")
foreach(arch IN LISTS KILN_CUDA_ARCHS)
  if(NOT arch IN_LIST KILN_CUDA_ARCHS_SUPPORTED)
    message(FATAL_ERROR "KILN_CUDA_ARCHS: ${arch} is not a supported architecture (${KILN_CUDA_ARCHS_SUPPORTED})")
  endif()
endforeach()
set(CMAKE_CUDA_ARCHITECTURES ${KILN_CUDA_ARCHS})
# Every kernel must fit this much shared memory per block (SM120/121 and SM86/89 opt-in limit).
set(KILN_SMEM_BUDGET 101376)

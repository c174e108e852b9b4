/* CRC-32C computed with the CPU's own instructions (see _crc32c_hw.c). */
#ifndef RILLET_CRC32C_HW_H
#define RILLET_CRC32C_HW_H

#include <stddef.h>
#include <stdint.h>

enum crc32c_hw_level {
    CRC32C_HW_NONE = 0,   /* no usable instructions: the caller uses the crc32c package */
    CRC32C_HW_SSE42 = 1,  /* the crc32 instruction, three interleaved streams */
    CRC32C_HW_AVX512 = 2, /* carry-less multiplication folding (VPCLMULQDQ), 256 B a turn */
};

/* Detect what the CPU offers and build the tables; returns the best level. */
int crc32c_hw_init(void);

/* The standard CRC-32C of src[0:n] (initial and final inversion) at `level`, which must
 * be at least CRC32C_HW_SSE42 and at most what crc32c_hw_init returned. */
uint32_t crc32c_hw(const unsigned char *src, size_t n, int level);

#endif

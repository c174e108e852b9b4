/* CRC-32C computed with the CPU's own instructions (see _crc32c_hw.c). */
#ifndef RILLET_CRC32C_HW_H
#define RILLET_CRC32C_HW_H

#include <stddef.h>
#include <stdint.h>

enum crc32c_hw_level {
    CRC32C_HW_NONE = 0,   /* nothing usable here: the caller uses the crc32c package */
    CRC32C_HW_AVX512 = 1, /* carry-less multiplication folding (VPCLMULQDQ), 256 B a turn */
};

/* Detect what the CPU (and compiler) offer, compute the constants; returns the level. */
int crc32c_hw_init(void);

/* The standard CRC-32C of src[0:n] (initial and final inversion). Only after
 * crc32c_hw_init returned CRC32C_HW_AVX512. */
uint32_t crc32c_hw(const unsigned char *src, size_t n);

#endif

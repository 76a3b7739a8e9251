/* CRC-32C (Castagnoli) and TFRecord's masked form of it. */
#ifndef RT_CRC32C_H
#define RT_CRC32C_H

#include "common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RT_HAVE_HW_CRC 1
RT_API __attribute__((target("sse4.2"))) uint32_t rt_crc32c_hw(uint32_t c, const uint8_t *p, size_t n);
#endif

RT_API uint32_t rt_crc32c_sw(uint32_t c, const uint8_t *p, size_t n);

/* The fastest implementation this CPU runs; rt_crc_init() picks it (call it once, first). */
RT_EXTERN uint32_t (*rt_crc32c_update)(uint32_t c, const uint8_t *p, size_t n);

RT_API void rt_crc_init(void);

static inline uint32_t masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = rt_crc32c_update(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

#endif

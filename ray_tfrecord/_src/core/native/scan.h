/* Framing: find the records in a byte stream and check their CRCs. */
#ifndef RT_SCAN_H
#define RT_SCAN_H

#include "common.h"

#define RT_SCAN_MAX_ERRORS 64

/* A framing defect at offset. length: what the length field claims (TRUNCATED_DATA, BAD_DATA_CRC);
 * available: the bytes that remain after the header (TRUNCATED_HEADER: the bytes that remain). */
typedef struct {
    int64_t offset;
    rt_status status;
    int64_t length, available;
} rt_frame_error;

typedef struct {
    int verify, final, skip, resync; /* in: the options of scan() */
    size_t limit;                    /* in: no record may start at or after this offset */
    Buf pos, lens;                   /* out: record header offsets and payload lengths (int64) */
    rt_frame_error errs[RT_SCAN_MAX_ERRORS]; /* out: the first defects found */
    int nerr, resyncing;
    int64_t nerr_total;
    size_t consumed, need;
} rt_scan;

/* Scans buf[0, n): RT_OK, or RT_OUT_OF_MEMORY when pos/lens could not grow (what was found so far
 * is kept). Framing defects are no failure: they are listed in errs. On return the caller owns
 * s->pos.p and s->lens.p (free them). */
RT_API rt_status rt_scan_run(rt_scan *s, const uint8_t *buf, size_t n);

#endif

/* The framing scan: pure C over a byte buffer, so the fuzz harness calls it without Python. */
#include "scan.h"

#include "crc32c.h"

/* Whether a record can start at q: its length CRC holds and its data CRC holds. 1 yes, 0 no, 2 not
 * known yet because the data has not all arrived (*need: the candidate's full framed size). A
 * candidate is never accepted unseen: an 8-byte payload followed by its CRC passes the length check
 * by construction, so only the data CRC tells such a false boundary apart. */
static int plausible_boundary(const uint8_t *buf, size_t n, size_t q, int final, size_t *need) {
    if (n - q < RT_HEADER_BYTES) return 0;
    if (masked_crc(buf + q, RT_LENGTH_BYTES) != rd32(buf + q + RT_LENGTH_BYTES)) return 0;
    uint64_t len = rd64(buf + q);
    if (len > n - q - RT_HEADER_BYTES || n - q - RT_HEADER_BYTES - len < RT_FOOTER_BYTES) {
        if (final) return 0;
        *need = len > SIZE_MAX - RT_FRAME_OVERHEAD ? SIZE_MAX : (size_t)len + RT_FRAME_OVERHEAD;
        return 2;
    }
    return masked_crc(buf + q + RT_HEADER_BYTES, (size_t)len) == rd32(buf + q + RT_HEADER_BYTES + len);
}

RT_API rt_status rt_scan_run(rt_scan *s, const uint8_t *buf, size_t n) {
    const int final = s->final, skip = s->skip;
    const size_t lim = s->limit;
    rt_frame_error *errs = s->errs;
    int nerr = 0;
    int64_t nerr_total = 0;
    size_t p = 0, need = 0;
    int resyncing = s->resync;
    rt_status status = RT_OK;
    while (p < n && p < lim) {
        if (resyncing) {
            size_t q = p;
            int verdict = 0;
            for (; q < n && q < lim; q++) {
                if (n - q < RT_HEADER_BYTES && !final) break;
                verdict = plausible_boundary(buf, n, q, final, &need);
                if (verdict) break;
            }
            if (verdict != 1) {
                /* Wait for more input, still resynchronising: from the candidate whose data is
                 * missing, or from the tail that could still start a record. */
                if (verdict == 0) need = 0;
                p = final && verdict == 0 ? (n < lim ? n : lim) : q;
                break;
            }
            p = q;
            resyncing = 0;
        }
        if (n - p < RT_HEADER_BYTES) {
            if (!final) {
                need = RT_HEADER_BYTES;
                break;
            }
            if (nerr < RT_SCAN_MAX_ERRORS) errs[nerr++] = (rt_frame_error){(int64_t)p, RT_TRUNCATED_HEADER, 0, (int64_t)(n - p)};
            nerr_total++;
            p = n;
            break;
        }
        uint64_t len = rd64(buf + p);
        if (masked_crc(buf + p, RT_LENGTH_BYTES) != rd32(buf + p + RT_LENGTH_BYTES)) {
            if (nerr < RT_SCAN_MAX_ERRORS) errs[nerr++] = (rt_frame_error){(int64_t)p, RT_BAD_LENGTH_CRC, 0, 0};
            nerr_total++;
            if (!skip) break;
            p += 1;
            resyncing = 1;
            continue;
        }
        size_t avail = n - p - RT_HEADER_BYTES;
        if (len > avail || avail - len < RT_FOOTER_BYTES) {
            if (!final) {
                need = len > SIZE_MAX - RT_FRAME_OVERHEAD ? SIZE_MAX : (size_t)len + RT_FRAME_OVERHEAD;
                break;
            }
            if (nerr < RT_SCAN_MAX_ERRORS)
                errs[nerr++] = (rt_frame_error){(int64_t)p, RT_TRUNCATED_DATA, (int64_t)(len > INT64_MAX ? INT64_MAX : len), (int64_t)avail};
            nerr_total++;
            if (!skip) break;
            p += 1;
            resyncing = 1;
            continue;
        }
        if (s->verify && masked_crc(buf + p + RT_HEADER_BYTES, (size_t)len) != rd32(buf + p + RT_HEADER_BYTES + len)) {
            if (nerr < RT_SCAN_MAX_ERRORS) errs[nerr++] = (rt_frame_error){(int64_t)p, RT_BAD_DATA_CRC, (int64_t)len, 0};
            nerr_total++;
            if (!skip) break;
            /* The length CRC held, so the length is trustworthy: drop exactly this record. */
            p += RT_FRAME_OVERHEAD + (size_t)len;
            continue;
        }
        if (buf_reserve(&s->pos, 8) || buf_reserve(&s->lens, 8)) {
            status = RT_OUT_OF_MEMORY;
            break;
        }
        int64_t ip = (int64_t)p, il = (int64_t)len;
        memcpy(s->pos.p + s->pos.len, &ip, 8);
        memcpy(s->lens.p + s->lens.len, &il, 8);
        s->pos.len += 8;
        s->lens.len += 8;
        p += RT_FRAME_OVERHEAD + (size_t)len;
    }
    s->nerr = nerr;
    s->nerr_total = nerr_total;
    s->consumed = p;
    s->need = need;
    s->resyncing = resyncing;
    return status;
}

/* JPEG window decode: the pixels of a crop window, with the inverse DCT, upsampling and colour
 * conversion done for the window's blocks only (libjpeg-turbo's jpeg_skip_scanlines and
 * jpeg_crop_scanline, as TensorFlow's decode_and_crop_jpeg). Built only where setup.py found
 * libjpeg-turbo (RT_HAVE_JPEG). */
#ifndef RT_JPEG_H
#define RT_JPEG_H

#include "common.h"

/* The window decode's size limits: more scans than this is a decompression bomb (a progressive
 * JPEG's scans are unbounded in the format); a coefficient buffer past this many bytes is refused
 * rather than allocated from a header's word. */
#define RT_JPEG_MAX_SCANS 500
#define RT_JPEG_MAX_MEMORY ((long)1 << 30)
#define RT_JPEG_MESSAGE 200

/* Decodes rows [y, y + h) and columns [x, x + w) of the JPEG data[0, n), scaled by the DCT to
 * 1/denom (1, 2, 4 or 8; the window is in the scaled image's pixels), into out: h * w * channels
 * bytes, row-major, channels 3 (RGB) or 1 (luma). Returns:
 * - RT_OK;
 * - RT_JPEG_CORRUPT: message holds libjpeg's reason (a warning counts, as in simplejpeg's strict mode);
 * - RT_JPEG_UNSUPPORTED: CMYK, YCCK, a precision other than 8, or past RT_JPEG_MAX_MEMORY; the caller
 *   decodes it another way;
 * - RT_JPEG_BAD_WINDOW: the window or out does not fit the image;
 * - RT_OUT_OF_MEMORY.
 * The whole scan is entropy-decoded, so damage outside the window is an error too; only the window's
 * blocks go through the inverse DCT, upsampling and colour conversion. */
RT_API rt_status rt_jpeg_decode_window(const uint8_t *data, size_t n, int denom, int channels, int y, int x, int h,
                                       int w, uint8_t *out, size_t out_len, char message[RT_JPEG_MESSAGE]);

#endif

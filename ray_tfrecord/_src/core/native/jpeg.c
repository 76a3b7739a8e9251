/* JPEG window decode on libjpeg-turbo (jpeg.h). libjpeg reports errors by calling error_exit, which
 * must not return: it longjmps back to the one setjmp in rt_jpeg_decode_window. */
#include "jpeg.h"

#ifdef RT_HAVE_JPEG

#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE */

#include <jpeglib.h>
#include <jerror.h>

_Static_assert(sizeof(unsigned long) >= sizeof(size_t), "jpeg_mem_src takes the length as an unsigned long");

typedef struct {
    struct jpeg_error_mgr pub;
    struct jpeg_progress_mgr progress;
    jmp_buf escape;
    rt_status status; /* what the longjmp reports */
    char *message;
} jpeg_failure;

static void jpeg_fail(j_common_ptr cinfo, rt_status status) {
    jpeg_failure *f = (jpeg_failure *)cinfo->err;
    f->status = status;
    longjmp(f->escape, 1);
}

static void jpeg_on_error(j_common_ptr cinfo) {
    jpeg_failure *f = (jpeg_failure *)cinfo->err;
    char text[JMSG_LENGTH_MAX];
    cinfo->err->format_message(cinfo, text);
    snprintf(f->message, RT_JPEG_MESSAGE, "%s", text);
    switch (cinfo->err->msg_code) {
    case JERR_OUT_OF_MEMORY: jpeg_fail(cinfo, RT_OUT_OF_MEMORY); break;
    /* Past RT_JPEG_MAX_MEMORY (a huge progressive image): not corrupt, only beyond this decode. */
    case JERR_NO_BACKING_STORE: jpeg_fail(cinfo, RT_JPEG_UNSUPPORTED); break;
    default: jpeg_fail(cinfo, RT_JPEG_CORRUPT);
    }
}

/* Level -1 is a warning about the data (extraneous bytes, a premature end): strict, so an error. */
static void jpeg_on_message(j_common_ptr cinfo, int level) {
    if (level < 0) jpeg_on_error(cinfo);
}

static void jpeg_on_progress(j_common_ptr cinfo) {
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (cinfo->is_decompressor && d->input_scan_number > RT_JPEG_MAX_SCANS) {
        jpeg_failure *f = (jpeg_failure *)cinfo->err;
        snprintf(f->message, RT_JPEG_MESSAGE, "more than %d scans", RT_JPEG_MAX_SCANS);
        jpeg_fail(cinfo, RT_JPEG_CORRUPT);
    }
}

RT_API rt_status rt_jpeg_decode_window(const uint8_t *data, size_t n, int denom, int channels, int y, int x, int h,
                                       int w, uint8_t *out, size_t out_len, char message[RT_JPEG_MESSAGE]) {
    message[0] = 0;
    if (!(denom == 1 || denom == 2 || denom == 4 || denom == 8) || !(channels == 1 || channels == 3) || y < 0 ||
        x < 0 || h < 1 || w < 1 || (size_t)h * (size_t)w * (size_t)channels != out_len)
        return RT_JPEG_BAD_WINDOW;
    struct jpeg_decompress_struct cinfo;
    jpeg_failure f = {.message = message};
    /* Written between setjmp and a longjmp, so volatile: it must survive the jump. */
    uint8_t *volatile row = NULL;
    cinfo.err = jpeg_std_error(&f.pub);
    f.pub.error_exit = jpeg_on_error;
    f.pub.emit_message = jpeg_on_message;
    if (setjmp(f.escape)) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        return f.status;
    }
    jpeg_create_decompress(&cinfo);
    cinfo.mem->max_memory_to_use = RT_JPEG_MAX_MEMORY;
    f.progress.progress_monitor = jpeg_on_progress;
    cinfo.progress = &f.progress;
    jpeg_mem_src(&cinfo, data, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.data_precision != 8 || cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK ||
        cinfo.jpeg_color_space == JCS_UNKNOWN)
        jpeg_fail((j_common_ptr)&cinfo, RT_JPEG_UNSUPPORTED);
    cinfo.out_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned)denom;
    jpeg_start_decompress(&cinfo);
    if ((unsigned)y > cinfo.output_height || (unsigned)h > cinfo.output_height - (unsigned)y ||
        (unsigned)x > cinfo.output_width || (unsigned)w > cinfo.output_width - (unsigned)x)
        jpeg_fail((j_common_ptr)&cinfo, RT_JPEG_BAD_WINDOW);
    /* The crop reaches one iMCU column past the window on either side: the chroma upsampling at a
     * crop's edge replicates its last samples where a full decode has the next ones, which changed
     * the window's edge columns by up to 25 levels. A progressive JPEG's block smoothing reaches
     * further, so it is not cropped across at all (its rows are still skipped). */
    JDIMENSION past = (JDIMENSION)(cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size);
    JDIMENSION right = cinfo.output_width - (JDIMENSION)x - (JDIMENSION)w; /* columns right of the window */
    JDIMENSION left = cinfo.progressive_mode || past >= (JDIMENSION)x ? 0 : (JDIMENSION)x - past;
    JDIMENSION width = (JDIMENSION)x - left + (JDIMENSION)w + (cinfo.progressive_mode || past >= right ? right : past);
    /* jpeg_crop_scanline moves left down to an iMCU column: the window is [x - left, + w) of each row. */
    if (left > 0 || width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &left, &width);
    if (left > (JDIMENSION)x || width < (JDIMENSION)(x - (int)left + w) || cinfo.output_width != width)
        jpeg_fail((j_common_ptr)&cinfo, RT_JPEG_BAD_WINDOW);
    size_t keep = (size_t)(x - (int)left) * (size_t)channels, stride = (size_t)w * (size_t)channels;
    row = malloc((size_t)width * (size_t)channels);
    if (!row) jpeg_fail((j_common_ptr)&cinfo, RT_OUT_OF_MEMORY);
    if (y > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)y) != (JDIMENSION)y)
        jpeg_fail((j_common_ptr)&cinfo, RT_JPEG_CORRUPT);
    for (int r = 0; r < h; r++) {
        JSAMPROW rows[1] = {row};
        if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
            snprintf(message, RT_JPEG_MESSAGE, "the data ends at row %d of %u", y + r, cinfo.output_height);
            jpeg_fail((j_common_ptr)&cinfo, RT_JPEG_CORRUPT);
        }
        memcpy(out + (size_t)r * stride, row + keep, stride);
    }
    /* The rows below the window are entropy-decoded too, so damage there is still an error: skipping
     * to the last row reads them (libjpeg-turbo skips to the very end without reading), and the last
     * row and jpeg_finish_decompress read on to the EOI. */
    JDIMENSION rest = cinfo.output_height - cinfo.output_scanline;
    if (rest > 1 && jpeg_skip_scanlines(&cinfo, rest - 1) != rest - 1) jpeg_fail((j_common_ptr)&cinfo, RT_JPEG_CORRUPT);
    if (rest > 0) {
        JSAMPROW rows[1] = {row};
        if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) jpeg_fail((j_common_ptr)&cinfo, RT_JPEG_CORRUPT);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(row);
    return RT_OK;
}

#endif

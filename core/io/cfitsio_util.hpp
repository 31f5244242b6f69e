#pragma once
// Shared by the CFITSIO adapters (fits_image, fits_table): an owning handle and error text.
#include <fitsio.h>

#include <cstddef>
#include <string>
#include <vector>

namespace gpuphot {

// Owns an open fitsfile; closes it (ignoring errors, clearing CFITSIO's message stack) when it goes
// out of scope. close() closes early and returns the status of the final flush.
struct FitsHandle {
    fitsfile* f = nullptr;
    // A file opened from memory (openFitsForReading: an inflated gzip file): the bytes, and the address
    // and size CFITSIO keeps pointers to while the file is open.
    std::vector<unsigned char> memory;
    void* memoryAddress = nullptr;
    std::size_t memorySize = 0;
    FitsHandle() = default;
    FitsHandle(const FitsHandle&) = delete;
    FitsHandle& operator=(const FitsHandle&) = delete;
    ~FitsHandle();
    int close();
};

// CFITSIO's status text plus the newest messages of its error stack (which it then clears).
std::string cfitsioText(int status);

// Walks the headers of every HDU of the plain FITS file at path (not compressed, no extended syntax)
// before CFITSIO parses them, and throws InvalidInput naming the file, the HDU and the card for a card
// that would crash CFITSIO 4.2.0: an unquoted TTYPEn value of 69 or more characters overflows CFITSIO's
// 70-byte column name (a fortified strcpy aborts; found by tests/fuzz/fuzz_refcat). Returns silently
// on anything it cannot walk (gzip, data cut short): CFITSIO reports those itself. A header the file ends
// inside is still checked.
void checkHeadersCfitsioCanParse(const std::string& path);
// The same walk over a FITS file's bytes in memory (`path` names it in errors), which CFITSIO will open
// from memory: IoError "truncated file" when the headers claim more bytes than `size` (a header cut
// short, or data as NAXISn, PCOUNT and GCOUNT size it), since CFITSIO 4.2.0's memory driver copies past
// its buffer instead of reporting the end of the file.
void checkHeaderBytesCfitsioCanParse(const std::string& path, const unsigned char* data, std::size_t size);

// The compression a file's first bytes show (n of them; 4 suffice): "gzip", the formats CFITSIO would
// decode itself ("zip", "Unix compress (.Z)", "pack", "LZH") and "bzip2"; "" for none (a plain FITS file
// or anything else). The one sniffer of the readers and of watch's completeness check.
std::string compressionOf(const unsigned char* head, std::size_t n);
// The first bytes of the file at `path` (up to `n`; fewer for a shorter file, none for an unreadable one).
std::vector<unsigned char> fileHead(const std::string& path, std::size_t n);

// Opens the FITS file at `path` read-only in h after checkHeadersCfitsioCanParse, and returns CFITSIO's
// status (0: open). A gzip-compressed file is inflated here, with zlib, and opened from memory after the
// same header checks on its content: CFITSIO 4.2.0 sizes its buffer from the gzip trailer's size field (a
// 6 kB file asked for 1.9 GB; found by tests/fuzz/fuzz_gzip_fits), and a header that would crash CFITSIO
// crashes it behind gzip too. Throws IoError for a truncated gzip stream, InvalidInput for a corrupt one
// or a header the checks refuse. A file in another compressed format CFITSIO would decode itself (zip,
// .Z, pack, LZH: its decoders trust the file's size fields), or in bzip2, is InvalidInput. `head`: the
// file's first bytes when the caller has read them (else they are read here).
int openFitsForReading(const std::string& path, FitsHandle& h);
int openFitsForReading(const std::string& path, FitsHandle& h, const std::vector<unsigned char>& head);

// Why CFITSIO must not inflate these bytes as one GZIP_1/GZIP_2 tile (empty: it may). CFITSIO 4.2.0
// (uncompress2mem_from_mem) grows its output buffer by 28 800 bytes for as long as zlib answers Z_OK or
// Z_BUF_ERROR, so a gzip stream that ends before its final block never stops growing the buffer: one
// 12 kB file ran until memory ran out (found by tests/fuzz/fuzz_fits_reader). This inflates the stream
// with zlib into a small scratch buffer and requires it to end within `bytes` and to produce at most
// `maxOut` bytes (a tile's pixels); bytes after the end of the stream are ignored, as CFITSIO does.
std::string gzipTileProblem(const unsigned char* data, std::size_t bytes, std::size_t maxOut);

// Why CFITSIO must not decode these bytes as one RICE_1 tile of `pixels` pixels (empty: it may).
// CFITSIO 4.2.0 (fits_rdecomp, _short, _byte) checks the end of the compressed bytes only after each
// block of `blockSize` pixels, and a run of zero bytes makes it read on without any bound: a fuzzed
// 8 kB frame crashed it (found by tests/fuzz/fuzz_fits_reader). This walks the stream exactly as
// CFITSIO's decoder does, without writing pixels, and requires every byte it reads to lie within
// `bytes`. `bytePix` (1, 2 or 4; CFITSIO decodes anything else as 4) is the ZVAL of BYTEPIX.
std::string riceTileProblem(const unsigned char* data, std::size_t bytes, long long pixels, int bytePix,
                            int blockSize);

// Why CFITSIO must not decode these bytes as one HCOMPRESS_1 tile of tileNx x tileNy pixels (tileNx along
// NAXIS1; empty: it may). CFITSIO 4.2.0 (fits_hdecompress, fits_hdecompress64) takes the tile's size from
// the stream itself and writes that many pixels into a buffer sized from ZTILEn, and its bit readers never
// look at the tile's byte count (heasarc/cfitsio issue #131). This requires the magic 0xDD 0x99, a stream
// size of exactly the tile's size, a scale >= 0 and bit plane counts the decoder can hold (32 for 8- and
// 16-bit images, which CFITSIO decodes in 32 bits, else 64), then walks the bit planes, quadtree codes and
// sign bits exactly as CFITSIO's decoder reads them, without writing pixels, and requires every byte it
// reads to lie within `bytes`. `zbitpix` is the image's ZBITPIX.
std::string hcompressTileProblem(const unsigned char* data, std::size_t bytes, long long tileNx,
                                 long long tileNy, int zbitpix);

// Why CFITSIO must not decode these 16-bit words as one PLIO_1 tile of `pixels` pixels (empty: it may).
// CFITSIO 4.2.0 (pl_l2pi) takes the line list's length and its first instruction's index from the list's
// own header words and never compares them with the tile's word count, so a crafted header makes it read
// up to 2 GB past the tile's words, or up to 64 kB before them. Its output stays within the tile's pixels.
// This walks the instructions as pl_l2pi does, without writing pixels, and requires every word it reads to
// lie within `count`, and the length to be positive (else CFITSIO leaves the tile's pixels unset).
std::string plioTileProblem(const short* words, std::size_t count, long long pixels);

} // namespace gpuphot

#include "core/pipeline/outputs.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/io/atomic_file.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {
namespace fs = std::filesystem;

void validateOutputOptions(const OutputOptions& o) {
    static const std::set<std::string> formats{"ecsv", "csv", "reg", "fits"};
    static const std::set<std::string> maps{"bkg", "rms", "seg", "psf", "resid"};
    for (const auto& f : o.formats)
        if (!formats.count(f)) throw InvalidInput("unknown output format '" + f + "' (expected ecsv, csv, reg)");
    for (const auto& m : o.maps)
        if (!maps.count(m)) throw InvalidInput("unknown map '" + m + "' (expected bkg, rms, seg, psf, resid)");
    std::error_code ec;
    if (!fs::is_directory(o.outdir, ec)) throw IoError("output directory " + o.outdir + " does not exist");
}

std::string frameStem(const std::string& path) {
    std::string name = fs::path(path).filename().string();
    if (auto b = name.find('['); b != std::string::npos) name.erase(b);
    for (const char* ext : {".gz", ".fz", ".fits", ".fit", ".fts", ".FITS", ".FIT"}) {
        const std::string e(ext);
        if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0)
            name.erase(name.size() - e.size());
    }
    return name;
}

std::string catalogPath(const std::string& framePath, const OutputOptions& o) {
    return (fs::path(o.outdir) / (frameStem(framePath) + ".cat.fits")).string();
}
std::string reportPath(const std::string& framePath, const OutputOptions& o) {
    return (fs::path(o.outdir) / (frameStem(framePath) + ".report.json")).string();
}

Image<float> psfMosaic(const PsfResult& psf) {
    if (psf.epsf.empty()) return Image<float>(1, 1, std::nanf(""));
    int cw = 0, ch = 0;
    for (const auto& c : psf.epsf) {
        cw = std::max(cw, c.image.width());
        ch = std::max(ch, c.image.height());
    }
    Image<float> out(cw * psf.gridNx, ch * psf.gridNy, 0.0f);
    for (int gy = 0; gy < psf.gridNy; ++gy)
        for (int gx = 0; gx < psf.gridNx; ++gx) {
            const auto& c = psf.epsf[static_cast<std::size_t>(gy) * psf.gridNx + gx];
            for (int y = 0; y < c.image.height(); ++y)
                for (int x = 0; x < c.image.width(); ++x) out(gx * cw + x, gy * ch + y) = c.image(x, y);
        }
    return out;
}

Image<float> residualImage(const Frame& frame, const BackgroundResult& bkg, const Sources& s, const PsfResult& psf) {
    const int w = frame.width(), h = frame.height();
    Image<float> out(w, h, Image<float>::NoInit{});
    const bool fullMap = bkg.level.width() == w && bkg.level.height() == h;
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            out(x, y) = frame.pixels(x, y) - (fullMap ? bkg.level(x, y) : static_cast<float>(bkg.globalLevel));
    if (psf.fluxPsf.size() != s.size() || psf.epsf.empty()) return out;
    const int r = std::max(1, psf.stampRadius);
    // Serial over sources: a fixed order of subtraction keeps the map bitwise reproducible.
    for (std::size_t i = 0; i < s.size(); ++i) {
        const double f = psf.fluxPsf[i];
        if (!std::isfinite(f)) continue;
        const int cx = static_cast<int>(std::lround(s.x[i])), cy = static_cast<int>(std::lround(s.y[i]));
        for (int y = std::max(0, cy - r); y <= std::min(h - 1, cy + r); ++y)
            for (int x = std::max(0, cx - r); x <= std::min(w - 1, cx + r); ++x)
                out(x, y) -= static_cast<float>(f * psf.epsfValue(s.x[i], s.y[i], x - s.x[i], y - s.y[i]));
    }
    return out;
}

std::vector<std::string> writeReductionOutputs(const Frame& frame, const PipelineResult& r, const Table& catalog,
                                               const OutputOptions& o, nlohmann::json& report) {
    const fs::path dir(o.outdir);
    const std::string stem = frameStem(frame.path.empty() ? std::string("frame") : frame.path);
    std::vector<std::string> written;
    nlohmann::json outputs;
    auto path = [&](const std::string& suffix) { return (dir / (stem + suffix)).string(); };

    Header mapHeader;
    if (frame.wcs) mapHeader.update(frame.wcs->toHeader());
    mapHeader.set("SRCFILE", frame.path.empty() ? std::string("frame") : frame.path, "reduced frame");
    for (const auto& m : o.maps) {
        const std::string p = path("." + m + ".fits");
        if (m == "bkg" || m == "rms") {
            const Image<float>& img = m == "bkg" ? r.background.level : r.background.rms;
            Header hdr = mapHeader;
            hdr.set("BUNIT", "adu");
            writeFitsImage(p, img.view(), hdr);
        } else if (m == "seg") {
            writeFitsImage(p, r.detection.segmentation.view(), mapHeader);
        } else if (m == "psf") {
            Header hdr;
            hdr.set("OVERSAMP", r.psf.epsf.empty() ? 0 : r.psf.epsf.front().oversampling, "ePSF nodes per pixel");
            hdr.set("GRIDNX", r.psf.gridNx, "ePSF cells along x");
            hdr.set("GRIDNY", r.psf.gridNy, "ePSF cells along y");
            hdr.set("FWHM", r.psf.medianFwhm, "[pix] median FWHM");
            writeFitsImage(p, psfMosaic(r.psf).view(), hdr);
        } else if (m == "resid") {
            writeFitsImage(p, residualImage(frame, r.background, r.detection.sources, r.psf).view(), mapHeader);
        }
        outputs[m] = p;
        written.push_back(p);
    }
    if (r.fittedWcs) { // STEM.wcs: a header-only FITS file with the fitted WCS, as astrometry.net writes
        Header wcsHeader = r.astrometry.wcs.toHeader();
        wcsHeader.set("ASTRMS", r.astrometry.rmsArcsec, "[arcsec] fit RMS");
        wcsHeader.set("ASTNUSED", r.astrometry.nUsed, "stars used");
        wcsHeader.set("IMAGEW", frame.width(), "image width");
        wcsHeader.set("IMAGEH", frame.height(), "image height");
        const std::string p = path(".wcs");
        writeFitsHeader(p, wcsHeader);
        outputs["wcs"] = p;
        written.push_back(p);
    }
    const std::string cat = path(".cat.fits");
    writeFitsTable(cat, catalog);
    outputs["catalog"] = cat;
    written.push_back(cat);
    for (const auto& f : o.formats) {
        std::string p;
        if (f == "ecsv") writeEcsv(p = path(".cat.ecsv"), catalog);
        else if (f == "csv") writeCsv(p = path(".cat.csv"), catalog);
        else if (f == "reg") {
            RegionStyle style;
            style.aCol = "a";
            style.bCol = "b";
            style.thetaCol = "theta";
            style.ellipseScale = 3.0;
            style.flagsCol = "flags";
            writeDs9Regions(p = path(".reg"), catalog, style);
        } else
            continue;
        outputs[f] = p;
        written.push_back(p);
    }
    const std::string rep = path(".report.json");
    outputs["report"] = rep;
    report["outputs"] = outputs;
    writeTextFileAtomic(rep, report.dump(2) + "\n");
    written.push_back(rep);
    return written;
}

} // namespace gpuphot

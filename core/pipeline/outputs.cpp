#include "core/pipeline/outputs.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>
#include <set>
#include <strings.h>

#include <fitsio.h>

#include "core/catalog/table.hpp"
#include "core/io/atomic_file.hpp"
#include "core/io/cfitsio_util.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/target_list.hpp"
#include "core/io/text_catalog.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/exposure.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/stages/aperture/forced_photometry.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {
namespace fs = std::filesystem;

void validateOutputOptions(const OutputOptions& o) {
    static const std::set<std::string> formats{"ecsv", "csv", "reg", "fits", "ldac"};
    static const std::set<std::string> maps{"bkg", "rms", "seg", "psf", "resid"};
    for (const auto& f : o.formats)
        if (!formats.count(f))
            throw InvalidInput("unknown output format '" + f + "' (expected ecsv, csv, reg, ldac)");
    for (const auto& m : o.maps)
        if (!maps.count(m)) throw InvalidInput("unknown map '" + m + "' (expected bkg, rms, seg, psf, resid)");
    if (o.sextractorCatalog) checkSextractorCatalog(o.sextractor);
    if (std::find(o.formats.begin(), o.formats.end(), "ldac") != o.formats.end() && !o.ldacParams.empty())
        checkSextractorCatalog(ldacOptions(o, 0));
    // A missing output directory is made (with its parents); a path that is something else is an error.
    std::error_code ec;
    if (fs::is_directory(o.outdir, ec)) return;
    if (fs::exists(o.outdir, ec)) throw IoError("output directory " + o.outdir + " is not a directory");
    fs::create_directories(o.outdir, ec);
    if (ec || !fs::is_directory(o.outdir))
        throw IoError("output directory " + o.outdir + " cannot be created: " + ec.message());
}

SextractorCatalogOptions ldacOptions(const OutputOptions& o, int apertures) {
    SextractorCatalogOptions ldac = o.sextractor;
    ldac.type = "FITS_LDAC";
    ldac.params = o.ldacParams.empty() ? defaultLdacParams(apertures) : o.ldacParams;
    return ldac;
}

std::vector<SextractorParam> defaultLdacParams(int apertures) {
    std::vector<SextractorParam> p;
    for (const char* n : {"NUMBER", "X_IMAGE", "Y_IMAGE", "XWIN_IMAGE", "YWIN_IMAGE", "ERRAWIN_IMAGE",
                          "ERRBWIN_IMAGE", "ERRTHETAWIN_IMAGE", "ALPHA_J2000", "DELTA_J2000", "FLUX_AUTO",
                          "FLUXERR_AUTO", "MAG_AUTO", "MAGERR_AUTO"})
        p.push_back({n, {}});
    if (apertures > 0)
        for (const char* n : {"FLUX_APER", "FLUXERR_APER", "MAG_APER", "MAGERR_APER"})
            p.push_back({n, {static_cast<long>(apertures)}});
    for (const char* n :
         {"FLUX_RADIUS", "FWHM_IMAGE", "A_IMAGE", "B_IMAGE", "THETA_IMAGE", "ELONGATION", "SNR_WIN", "FLAGS"})
        p.push_back({n, {}});
    return p;
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

std::string outputStem(const std::string& framePath, const std::string& hduSpec) {
    const std::string base = frameStem(framePath);
    std::string selection = hduSpec, file = framePath;
    if (const auto b = framePath.find('['); b != std::string::npos && framePath.back() == ']') {
        const auto e = framePath.find(']', b);
        selection = framePath.substr(b + 1, e - b - 1);
        file = framePath.substr(0, b);
    }
    while (!selection.empty() && std::isspace(static_cast<unsigned char>(selection.back())))
        selection.pop_back();
    while (!selection.empty() && std::isspace(static_cast<unsigned char>(selection.front())))
        selection.erase(0, 1);
    if (selection.empty() || isExposureSelection(selection)) return base;
    const bool numeric = std::all_of(selection.begin(), selection.end(),
                                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    const std::string name = selection.substr(0, selection.find(','));
    try {
        for (const ExposureExtension& e : imageExtensions(file))
            if (numeric ? std::to_string(e.hdu) == selection
                        : strcasecmp(e.extname.c_str(), name.c_str()) == 0)
                return base + "." + e.token;
    } catch (const std::exception&) { // unreadable here: the reduction says why; the name still stands
    }
    return base + "." +
           (numeric ? outputToken(std::stoi(selection.substr(0, 6)), {}, false)
                    : outputToken(0, name, false));
}

std::string catalogPath(const std::string& framePath, const OutputOptions& o, const std::string& hduSpec) {
    return (fs::path(o.outdir) / (outputStem(framePath, hduSpec) + ".cat.fits")).string();
}
std::string reportPath(const std::string& framePath, const OutputOptions& o, const std::string& hduSpec) {
    return (fs::path(o.outdir) / (outputStem(framePath, hduSpec) + ".report.json")).string();
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
    const bool sampled = !fullMap && bkg.sampler && bkg.sampler->width() == w && bkg.sampler->height() == h;
    ParallelErrors errors;
#pragma omp parallel
    {
        std::vector<float> lv;
        errors.run([&] { lv.resize(sampled ? w : 0); });
#pragma omp for schedule(static)
        for (int y = 0; y < h; ++y) {
            if (errors.failed()) continue;
            if (sampled) bkg.sampler->row(y, lv.data(), nullptr);
            for (int x = 0; x < w; ++x)
                out(x, y) = frame.pixels(x, y) - (fullMap ? bkg.level(x, y)
                                                  : sampled ? lv[x]
                                                            : static_cast<float>(bkg.globalLevel));
        }
    }
    errors.rethrow();
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

namespace {

void writeMap(const std::string& kind, const std::string& p, const Frame& frame, const PipelineResult& r,
              const Header& mapHeader) {
    if (kind == "bkg" || kind == "rms") {
        const Image<float>& kept = kind == "bkg" ? r.background.level : r.background.rms;
        Image<float> made; // evaluated from the sampler when the run kept no full maps
        if (kept.empty() && r.background.sampler) {
            const BackgroundSampler& smp = *r.background.sampler;
            made = Image<float>(smp.width(), smp.height(), Image<float>::NoInit{});
#pragma omp parallel for schedule(static)
            for (int y = 0; y < smp.height(); ++y)
                smp.row(y, kind == "bkg" ? made.row(y) : nullptr, kind == "bkg" ? nullptr : made.row(y));
        }
        const Image<float>& img = kept.empty() ? made : kept;
        Header hdr = mapHeader;
        hdr.set("BUNIT", "adu");
        writeFitsImage(p, img.view(), hdr);
    } else if (kind == "seg") {
        writeFitsImage(p, r.detection.segmentation.view(), mapHeader);
    } else if (kind == "psf") {
        Header hdr;
        hdr.set("OVERSAMP", r.psf.epsf.empty() ? 0 : r.psf.epsf.front().oversampling, "ePSF nodes per pixel");
        hdr.set("GRIDNX", r.psf.gridNx, "ePSF cells along x");
        hdr.set("GRIDNY", r.psf.gridNy, "ePSF cells along y");
        hdr.set("FWHM", r.psf.medianFwhm, "[pix] median FWHM");
        writeFitsImage(p, psfMosaic(r.psf).view(), hdr);
    } else if (kind == "resid") {
        writeFitsImage(p, residualImage(frame, r.background, r.detection.sources, r.psf).view(), mapHeader);
    }
}

} // namespace

void writeImageProducts(const Frame& frame, const PipelineResult& r, const OutputOptions& o,
                        const std::string& stem, const std::string& keyPrefix, nlohmann::json& outputs,
                        std::vector<std::string>& written) {
    auto path = [&](const std::string& suffix) { return (fs::path(o.outdir) / (stem + suffix)).string(); };
    auto record = [&](const std::string& kind, const std::string& p) {
        outputs[keyPrefix + kind] = p;
        written.push_back(p);
    };
    Header mapHeader;
    if (frame.wcs) mapHeader.update(frame.wcs->toHeader());
    mapHeader.set("SRCFILE", frame.path.empty() ? std::string("frame") : frame.path, "reduced frame");
    if (!frame.extname.empty()) mapHeader.set("SRCEXT", frame.extname, "EXTNAME of the reduced HDU");
    for (const auto& m : o.maps) {
        writeMap(m, path("." + m + ".fits"), frame, r, mapHeader);
        record(m, path("." + m + ".fits"));
    }
    if (r.fittedWcs) { // STEM.wcs: a header-only FITS file with the fitted WCS, as astrometry.net writes
        Header wcsHeader = r.astrometry.wcs.toHeader();
        wcsHeader.set("ASTRMS", r.astrometry.rmsArcsec, "[arcsec] fit RMS");
        wcsHeader.set("ASTNUSED", r.astrometry.nUsed, "stars used");
        wcsHeader.set("IMAGEW", frame.width(), "image width");
        wcsHeader.set("IMAGEH", frame.height(), "image height");
        writeFitsHeader(path(".wcs"), wcsHeader);
        record("wcs", path(".wcs"));
    }
    if (o.writeSolved && r.fittedWcs && !frame.path.empty()) {
        char history[80];
        std::snprintf(history, sizeof history, "WCS replaced by gpuphot's %s fit: RMS %.3f arcsec, %d stars",
                      r.astrometry.method.c_str(), r.astrometry.rmsArcsec, r.astrometry.nUsed);
        writeSolvedFrame(frame.path, frame.hdu, r.astrometry.wcs.toHeader(), path(".solved.fits"), history);
        record("solved", path(".solved.fits"));
    }
}

void writeTargetTables(const Table& targets, const OutputOptions& o, const std::string& stem,
                       nlohmann::json& outputs, std::vector<std::string>& written) {
    auto path = [&](const std::string& suffix) { return (fs::path(o.outdir) / (stem + suffix)).string(); };
    writeFitsTable(path(".targets.fits"), targets);
    outputs["targets"] = path(".targets.fits");
    written.push_back(path(".targets.fits"));
    for (const auto& f : o.formats) {
        if (f != "ecsv" && f != "csv") continue;
        const std::string q = path(".targets." + f);
        if (f == "ecsv")
            writeEcsv(q, targets);
        else
            writeCsv(q, targets);
        outputs["targets_" + f] = q;
        written.push_back(q);
    }
}

void writeCatalogFormats(const Table& catalog, const OutputOptions& o, const std::string& stem,
                         nlohmann::json& outputs, std::vector<std::string>& written) {
    auto path = [&](const std::string& suffix) { return (fs::path(o.outdir) / (stem + suffix)).string(); };
    for (const auto& f : o.formats) {
        std::string p;
        if (f == "ecsv") writeEcsv(p = path(".cat.ecsv"), catalog);
        else if (f == "csv")
            writeCsv(p = path(".cat.csv"), catalog);
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
}

bool outputsReadPixels(const OutputOptions& o) {
    return !o.maps.empty() || o.sextractorCatalog ||
           std::find(o.formats.begin(), o.formats.end(), "ldac") != o.formats.end();
}

std::vector<std::string> writeReductionOutputs(const Frame& frame, const PipelineResult& r,
                                               const Table& catalog, const OutputOptions& o,
                                               nlohmann::json& report, const Table* targets,
                                               const std::string& stemGiven) {
    const fs::path dir(o.outdir);
    const std::string stem =
        !stemGiven.empty() ? stemGiven : frameStem(frame.path.empty() ? std::string("frame") : frame.path);
    std::vector<std::string> written;
    nlohmann::json outputs;
    auto path = [&](const std::string& suffix) { return (dir / (stem + suffix)).string(); };
    writeImageProducts(frame, r, o, stem, "", outputs, written);
    if (targets) writeTargetTables(*targets, o, stem, outputs, written);
    const std::string cat = path(".cat.fits");
    writeFitsTable(cat, catalog);
    outputs["catalog"] = cat;
    written.push_back(cat);
    writeCatalogFormats(catalog, o, stem, outputs, written);
    if (std::find(o.formats.begin(), o.formats.end(), "ldac") != o.formats.end()) {
        writeSextractorCatalog(path(".ldac"), frame, r, catalog,
                               ldacOptions(o, static_cast<int>(r.aperture.radii.size())));
        outputs["ldac"] = path(".ldac");
        written.push_back(path(".ldac"));
    }
    if (o.sextractorCatalog) {
        const std::string p =
            (dir / (o.sextractor.prefixStem ? stem + "." + o.sextractor.name : o.sextractor.name)).string();
        writeSextractorCatalog(p, frame, r, catalog, o.sextractor);
        outputs["sextractor"] = p;
        written.push_back(p);
    }
    const std::string rep = path(".report.json");
    outputs["report"] = rep;
    report["outputs"] = outputs;
    writeTextFileAtomic(rep, report.dump(2) + "\n");
    written.push_back(rep);
    return written;
}

bool isPrimaryWcsKeyword(const std::string& key) {
    static const std::regex wcs(
        "(CTYPE|CRPIX|CRVAL|CDELT|CUNIT|CROTA|CRDER|CSYER|CNAME)[0-9]+|(CD|PC|PV|PS)[0-9]+_[0-9]+|"
        "(A|B|AP|BP)_[0-9]+_[0-9]+|(A|B|AP|BP)_ORDER|(A|B)_DMAX|LONPOLE|LATPOLE|RADESYS|RADECSYS|EQUINOX|"
        "WCSAXES|WCSNAME|(CPDIS|CQDIS|CPERR|CQERR|DP|DQ)[0-9]+|DVERR[0-9]*");
    return std::regex_match(key, wcs);
}

namespace {

// Replaces the primary WCS of HDU solved.hdu of the open file; throws IoError starting with `where`.
void replaceWcs(fitsfile* f, const SolvedHdu& solved, const std::string& where) {
    int status = 0, type = 0, nkeys = 0;
    auto check = [&](const std::string& what) {
        if (status)
            throw IoError(where + ": HDU " + std::to_string(solved.hdu) + ": " + what + ": " +
                          cfitsioText(status));
    };
    fits_movabs_hdu(f, solved.hdu + 1, &type, &status);
    check("no HDU " + std::to_string(solved.hdu));
    fits_get_hdrspace(f, &nkeys, nullptr, &status);
    check("reading the header");
    bool checksum = false;
    for (int k = nkeys; k >= 1; --k) {
        char name[FLEN_KEYWORD] = {}, value[FLEN_VALUE] = {}, comment[FLEN_COMMENT] = {};
        fits_read_keyn(f, k, name, value, comment, &status);
        check("reading the header");
        const std::string key(name);
        if (key == "CHECKSUM") checksum = true;
        if (isPrimaryWcsKeyword(key)) fits_delete_record(f, k, &status), check("removing " + key);
    }
    for (const auto& card : solved.wcs.cards()) {
        const std::string record = Header::formatCard(card);
        if (card.key == "COMMENT" || card.key == "HISTORY" || card.key.empty() || card.key.size() > 8) {
            fits_write_record(f, record.c_str(), &status);
        } else {
            char key[FLEN_KEYWORD] = {};
            std::snprintf(key, sizeof key, "%s", card.key.c_str());
            char rec[FLEN_CARD] = {};
            std::snprintf(rec, sizeof rec, "%s", record.c_str());
            fits_update_card(f, key, rec, &status);
        }
        check("writing " + card.key);
    }
    if (!solved.history.empty())
        fits_write_history(f, solved.history.c_str(), &status), check("writing HISTORY");
    if (checksum) fits_write_chksum(f, &status), check("updating CHECKSUM");
}

} // namespace

void writeSolvedFrame(const std::string& framePath, const std::vector<SolvedHdu>& hdus,
                      const std::string& outPath) {
    std::string source = framePath;
    if (!source.empty() && source.back() == ']')
        if (const auto b = source.find('['); b != std::string::npos) source.erase(b);
    AtomicOutput out(outPath);
    int status = 0;
    auto fail = [&](const std::string& what) {
        throw IoError("writing " + outPath + " (copy of " + source + " with the fitted WCS): " + what + ": " +
                      cfitsioText(status));
    };
    FitsHandle in, copy;
    if (fits_open_file(&in.f, source.c_str(), READONLY, &status)) fail("cannot open the frame");
    if (fits_create_file(&copy.f, out.tempPath().c_str(), &status)) fail("cannot create the file");
    if (fits_copy_file(in.f, copy.f, 1, 1, 1, &status)) fail("copying the HDUs");
    for (const SolvedHdu& h : hdus)
        replaceWcs(copy.f, h, "writing " + outPath + " (copy of " + source + " with the fitted WCS)");
    in.close();
    if ((status = copy.close()) != 0) fail("closing");
    out.commit();
}

void writeSolvedFrame(const std::string& framePath, int hdu, const Header& wcsCards,
                      const std::string& outPath, const std::string& history) {
    writeSolvedFrame(framePath, std::vector<SolvedHdu>{{hdu, wcsCards, history}}, outPath);
}

Table buildTargetTable(const Frame& frame, const PipelineResult& r, const TargetList& targets,
                       const ForcedPhotometryResult& forced) {
    const std::size_t n = targets.size();
    if (forced.count != n) throw InvalidInput("targets table: forced photometry of " + std::to_string(forced.count) +
                                              " positions for " + std::to_string(n) + " targets");
    const double nan = std::nan("");
    const ApertureResult& ap = forced.aperture;
    Table t;
    t.name = "TARGETS";
    t.add("name", targets.name, "", "target name (or row number) from " + targets.path);
    t.add("ra", targets.ra, "deg", "right ascension as given");
    t.add("dec", targets.dec, "deg", "declination as given");
    std::vector<double> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) {
        x[i] = forced.x[i] + 1.0;
        y[i] = forced.y[i] + 1.0;
    }
    t.add("x", x, "pix", "position on the frame (FITS 1-based) through the WCS");
    t.add("y", y, "pix", "position on the frame (FITS 1-based) through the WCS");
    const bool haveAp = ap.count == n;
    addApertureColumns(t, ap, n);
    const ZeroPointResult& zp = r.zeropoint;
    std::vector<double> magCal(n, nan), magErrCal(n, nan);
    std::vector<std::int16_t> aperCal(n, -1);
    for (std::size_t i = 0; i < n; ++i) {
        aperCal[i] = static_cast<std::int16_t>(forced.calAperture[i] >= 0 ? forced.calAperture[i] + 1 : -1);
        if (zp.ok && std::isfinite(forced.magTotal[i])) {
            magCal[i] = forced.magTotal[i] + zp.zp;
            magErrCal[i] = std::hypot(forced.magTotalErr[i], zp.zpErr);
        }
    }
    t.add("mag_cal", magCal, "mag",
          "mag_aper of aper_cal + APCOR of that aperture + ZP (no colour term: the target's colour is unknown)");
    t.add("magerr_cal", magErrCal, "mag", "error of mag_cal (photometric, aperture-correction and ZP errors)");
    t.add("aper_cal", aperCal, "", "aperture (1-based) of highest S/N used for mag_cal (-1: none)");
    t.add("sky", haveAp ? ap.sky : std::vector<double>(n, nan), "adu", "local sky per pixel");
    std::vector<std::int32_t> flags(n);
    for (std::size_t i = 0; i < n; ++i) flags[i] = static_cast<std::int32_t>(forced.flags[i]);
    t.add("flags", flags, "", "aperture flag bits (docs/FLAGS.md) | 2^24 off frame | 2^25 detected | 2^26 near edge");
    std::vector<std::int64_t> detId(n, -1);
    for (std::size_t i = 0; i < n; ++i)
        if (forced.detIndex[i] >= 0) detId[i] = static_cast<std::int64_t>(forced.detIndex[i]) + 1;
    t.add("det_id", detId, "", "id of the catalog source within the match radius (-1: not detected)");
    t.add("det_sep", forced.detSeparation, "pix", "distance to that source");

    Header& h = t.meta;
    for (std::size_t k = 0; k < ap.radii.size(); ++k) {
        const std::string suffix = std::to_string(k + 1);
        h.set("APRAD" + suffix, ap.radii[k], "[pix] radius of aperture " + suffix);
        if (k < r.aperture.apCorrMag.size())
            h.set("APCOR" + suffix, r.aperture.apCorrMag[k], "[mag] aperture correction to total (catalog's)");
    }
    h.set("FWHM", r.fwhm, "[pix] median FWHM of the field (" + r.fwhmSource + ")");
    h.set("ZP", zp.ok ? zp.zp : nan, zp.ok ? "[mag] photometric zero point" : "[mag] not calibrated");
    h.set("ZPERR", zp.ok ? zp.zpErr : nan, "[mag] error of ZP");
    h.set("MJD-MID", frame.instrument.mjdMid, "mid-exposure MJD");
    h.set("AIRMASS", frame.instrument.airmass, "airmass");
    h.set("WCSSRC", r.fittedWcs ? std::string("fitted (") + r.astrometry.method + ")" : std::string("header"),
          "WCS that placed the targets");
    h.set("TARGFILE", targets.path, "target list");
    if (!frame.path.empty()) h.set("SRCFILE", frame.path, "reduced frame");
    h.set("SWVERSN", "gpuphot " GPUPHOT_VERSION, "software version");
    return t;
}

} // namespace gpuphot

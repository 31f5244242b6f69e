// `gpuphot simulate`: runs the real binary (GPUPHOT_CLI) and opens what it wrote with CFITSIO.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <fitsio.h>
#include <nlohmann/json.hpp>

#include "tests/app/cli_run.hpp"

using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

// Minimal CFITSIO reader for the checks (independent of the project's own FITS code).
class Fits {
public:
    explicit Fits(const std::string& path) {
        if (fits_open_file(&m_f, path.c_str(), READONLY, &m_status)) m_f = nullptr;
    }
    ~Fits() {
        int s = 0;
        if (m_f) fits_close_file(m_f, &s);
    }
    bool ok() const { return m_f != nullptr && m_status == 0; }
    int hduCount() {
        int n = 0;
        fits_get_num_hdus(m_f, &n, &m_status);
        return n;
    }
    void moveTo(int hdu1) {
        int type = 0;
        fits_movabs_hdu(m_f, hdu1, &type, &m_status);
    }
    long long key(const char* name) {
        long long v = 0;
        int s = 0;
        fits_read_key(m_f, TLONGLONG, name, &v, nullptr, &s);
        return s ? -999999 : v;
    }
    double keyDouble(const char* name) {
        double v = 0;
        int s = 0;
        fits_read_key(m_f, TDOUBLE, name, &v, nullptr, &s);
        return s ? std::nan("") : v;
    }
    bool hasKey(const char* name) {
        char card[FLEN_CARD];
        int s = 0;
        fits_read_card(m_f, name, card, &s);
        return s == 0;
    }
    long long rows() {
        long long n = 0;
        fits_get_num_rowsll(m_f, &n, &m_status);
        return n;
    }
    int column(const char* name) {
        int col = 0, s = 0;
        fits_get_colnum(m_f, CASEINSEN, const_cast<char*>(name), &col, &s);
        return s ? 0 : col;
    }
    std::vector<double> readColumn(const char* name) {
        std::vector<double> v(static_cast<std::size_t>(rows()));
        int anynul = 0;
        fits_read_col(m_f, TDOUBLE, column(name), 1, 1, static_cast<LONGLONG>(v.size()), nullptr, v.data(), &anynul,
                      &m_status);
        return v;
    }
    std::vector<float> readImage(long w, long h) {
        std::vector<float> v(static_cast<std::size_t>(w * h));
        int anynul = 0;
        fits_read_img(m_f, TFLOAT, 1, static_cast<LONGLONG>(v.size()), nullptr, v.data(), &anynul, &m_status);
        return v;
    }
    int status() const { return m_status; }

private:
    fitsfile* m_f = nullptr;
    int m_status = 0;
};

} // namespace

TEST(CliSimulate, WritesImageTruthAndReferenceAsValidFits) {
    TempDir dir("gpuphot_cli_sim");
    const CliResult r = runCli("simulate --size 300x200 --stars 120 --seed 5 --fwhm 2.5 --galaxies 4 -o " + dir.str() +
                               " --name f --threads 2");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_NE(r.out.find("f.fits"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("time"), std::string::npos) << r.out;
    for (const char* f : {"f.fits", "f.truth.fits", "f.ref.fits"}) EXPECT_TRUE(fs::exists(dir / f)) << f;
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator{}), 3) << "no temporary files left";

    Fits img(dir / "f.fits");
    ASSERT_TRUE(img.ok());
    EXPECT_EQ(img.key("NAXIS"), 2);
    EXPECT_EQ(img.key("NAXIS1"), 300);
    EXPECT_EQ(img.key("NAXIS2"), 200);
    EXPECT_EQ(img.key("BITPIX"), -32);
    EXPECT_DOUBLE_EQ(img.keyDouble("SIMFWHM"), 2.5);
    EXPECT_EQ(img.key("SIMSEED"), 5);
    EXPECT_TRUE(std::isfinite(img.keyDouble("SIMZP")));
    for (const char* k : {"GAIN", "RDNOISE", "SATURATE", "EXPTIME", "FILTER", "DATE-OBS", "MJD-OBS", "AIRMASS", "OBJECT",
                          "CTYPE1", "CRVAL1", "CD1_1", "A_ORDER", "RA", "DEC"})
        EXPECT_TRUE(img.hasKey(k)) << k;
    const std::vector<float> pix = img.readImage(300, 200);
    EXPECT_EQ(img.status(), 0);
    double mean = 0;
    for (float v : pix) mean += v;
    mean /= pix.size();
    EXPECT_GT(mean, 0.9 * img.keyDouble("SIMSKY")) << "sky is there";

    Fits truth(dir / "f.truth.fits");
    ASSERT_TRUE(truth.ok());
    truth.moveTo(2);
    EXPECT_EQ(truth.rows(), 124);
    for (const char* c : {"id", "x", "y", "ra", "dec", "flux", "mag", "mag_inst", "fwhm", "ellipticity", "is_galaxy",
                          "saturated"})
        EXPECT_GT(truth.column(c), 0) << c;
    const auto x = truth.readColumn("x"), y = truth.readColumn("y");
    for (std::size_t i = 0; i < x.size(); ++i) {
        EXPECT_GE(x[i], 0.5);
        EXPECT_LE(x[i], 300.5);
        EXPECT_GE(y[i], 0.5);
        EXPECT_LE(y[i], 200.5);
    }
    Fits ref(dir / "f.ref.fits");
    ASSERT_TRUE(ref.ok());
    ref.moveTo(2);
    EXPECT_GT(ref.rows(), 0);
    for (const char* c : {"ra", "dec", "mag", "mag_err"}) EXPECT_GT(ref.column(c), 0) << c;
}

TEST(CliSimulate, Unsigned16BitNoWcsAndWrongWcs) {
    TempDir dir("gpuphot_cli_sim16");
    CliResult r = runCli("simulate --size 64x48 --stars 10 --bitpix 16 --no-wcs -q -o " + dir.str() + " --name u");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_TRUE(r.out.empty()) << "-q prints nothing: " << r.out;
    {
        Fits img(dir / "u.fits");
        ASSERT_TRUE(img.ok());
        EXPECT_EQ(img.key("BITPIX"), 16);
        EXPECT_EQ(img.key("BZERO"), 32768);
        EXPECT_FALSE(img.hasKey("CTYPE1"));
        EXPECT_TRUE(img.hasKey("RA"));
    }
    r = runCli("simulate --size 64x48 --stars 10 --wcs-offset 3 --wcs-rotation 1.5 -q -o " + dir.str() + " --name w");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    Fits img(dir / "w.fits");
    ASSERT_TRUE(img.ok());
    EXPECT_DOUBLE_EQ(img.keyDouble("SIMWOFF"), 3.0);
    EXPECT_DOUBLE_EQ(img.keyDouble("SIMWROT"), 1.5);
    EXPECT_GT(std::fabs(img.keyDouble("CRVAL1") - img.keyDouble("SIMCRVL1")), 1e-3);
}

TEST(CliSimulate, ConfigFileSetAndDumpConfig) {
    TempDir dir("gpuphot_cli_simcfg");
    {
        std::ofstream cfg(dir / "c.json");
        cfg << R"({"width": 321, "height": 123, "fwhmCornerFactor": 1.3, "psf": "gaussian"})";
    }
    // Precedence: defaults < --config < explicit options < --set.
    CliResult r = runCli("simulate --config " + (dir / "c.json") +
                         " --size 100x90 --set fwhm=4.5 --set psf=moffat --dump-config -o " + dir.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("width"), 100);
    EXPECT_EQ(j.at("height"), 90);
    EXPECT_DOUBLE_EQ(j.at("fwhmCornerFactor").get<double>(), 1.3);
    EXPECT_DOUBLE_EQ(j.at("fwhm").get<double>(), 4.5);
    EXPECT_EQ(j.at("psf"), "moffat");
    EXPECT_FALSE(fs::exists(dir / "sim.fits")) << "--dump-config writes nothing";

    // A typo in the config is an input error (exit code 2) naming the key.
    {
        std::ofstream cfg(dir / "bad.json");
        cfg << R"({"fwhmm": 3})";
    }
    r = runCli("simulate --config " + (dir / "bad.json") + " -o " + dir.str());
    EXPECT_EQ(r.exitCode, 2);
    EXPECT_NE(r.err.find("fwhmm"), std::string::npos) << r.err;
    r = runCli("simulate --size 12x -o " + dir.str());
    EXPECT_EQ(r.exitCode, 2) << r.err;
    r = runCli("simulate --bitpix 8 -o " + dir.str());
    EXPECT_NE(r.exitCode, 0);
}

TEST(CliSimulate, SameSeedSameFileDifferentThreads) {
    TempDir dir("gpuphot_cli_simdet");
    ASSERT_EQ(runCli("simulate --size 200x150 --stars 80 --seed 11 -q --threads 1 -o " + dir.str() + " --name a").exitCode, 0);
    ASSERT_EQ(runCli("simulate --size 200x150 --stars 80 --seed 11 -q --threads 2 -o " + dir.str() + " --name b").exitCode, 0);
    Fits a(dir / "a.fits"), b(dir / "b.fits");
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a.readImage(200, 150), b.readImage(200, 150));
}

// Export file names (ui/file_names.hpp): the suffix of a save dialog's filter and the default suffix.
#include <gtest/gtest.h>

#include "ui/file_names.hpp"

using gpuphot::ui::filterSuffix;
using gpuphot::ui::withDefaultSuffix;

TEST(FileNames, FilterSuffixIsTheFirstPatterns) {
    EXPECT_EQ(filterSuffix(QStringLiteral("ECSV (*.ecsv)")), QStringLiteral(".ecsv"));
    EXPECT_EQ(filterSuffix(QStringLiteral("WCS (*.wcs *.fits)")), QStringLiteral(".wcs"));
    EXPECT_EQ(filterSuffix(QStringLiteral("FITS (*.fits.fz)")), QStringLiteral(".fits.fz"));
    EXPECT_EQ(filterSuffix(QStringLiteral("All files (*)")), QString());
    EXPECT_EQ(filterSuffix(QString()), QString());
}

TEST(FileNames, OnlyANameWithoutSuffixGetsTheDefault) {
    EXPECT_EQ(withDefaultSuffix(QStringLiteral("/data/night/cat"), QStringLiteral(".fits")),
              QStringLiteral("/data/night/cat.fits"));
    EXPECT_EQ(withDefaultSuffix(QStringLiteral("/data/night/cat.csv"), QStringLiteral(".fits")),
              QStringLiteral("/data/night/cat.csv"));
    // a dot in a folder's name is not the file's suffix
    EXPECT_EQ(withDefaultSuffix(QStringLiteral("/data/n.1/cat"), QStringLiteral(".reg")),
              QStringLiteral("/data/n.1/cat.reg"));
    EXPECT_EQ(withDefaultSuffix(QString(), QStringLiteral(".reg")), QString());
    EXPECT_EQ(withDefaultSuffix(QStringLiteral("cat"), QString()), QStringLiteral("cat"));
}

// Following a folder: a frame the camera is still writing is not announced; once its data is all on disk it
// is, at the next change of the folder or poll; the workbench's own outputs are never frames.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QSignalSpy>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/io/fits_image.hpp"
#include "core/model/image.hpp"
#include "tests/test_support.hpp"
#include "ui/folder_follower.hpp"

namespace fs = std::filesystem;

TEST(FolderFollower, AnnouncesAFrameOnlyWhenItsDataIsComplete) {
    gpuphot::test::uiTestApp();
    gpuphot::test::TempDir src, dir;
    const std::string frame = (src.path / "f.fits").string();
    gpuphot::Image<float> img(200, 150);
    for (int y = 0; y < 150; ++y)
        for (int x = 0; x < 200; ++x)
            img(x, y) = static_cast<float>((x * 13 + y) % 101);
    gpuphot::writeFitsImage(frame, img.view(), gpuphot::Header{});
    std::string bytes(fs::file_size(frame), '\0');
    std::ifstream(frame, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));

    gpuphot::ui::FolderFollower follower;
    follower.setPollInterval(100);
    follower.follow(QString::fromStdString(dir.path.string()));
    QSignalSpy ready(&follower, &gpuphot::ui::FolderFollower::frameReady);
    const fs::path target = dir.path / "night_0001.fits";
    {
        std::ofstream out(target, std::ios::binary);
        out.write(bytes.data(), static_cast<std::streamsize>(2 * 2880)); // the header and a first block
    }
    EXPECT_FALSE(ready.wait(800)) << "announced a frame still being written";
    {
        std::ofstream out(target, std::ios::binary | std::ios::app);
        out.write(bytes.data() + 2 * 2880, static_cast<std::streamsize>(bytes.size() - 2 * 2880));
    }
    ASSERT_TRUE(ready.count() > 0 || ready.wait(5000));
    EXPECT_EQ(ready.at(0).at(0).toString().toStdString(), target.string());
    // A catalog written beside it is not a frame.
    fs::copy_file(frame, dir.path / "night_0001.cat.fits");
    EXPECT_FALSE(ready.wait(600));
    EXPECT_EQ(ready.count(), 1);
}

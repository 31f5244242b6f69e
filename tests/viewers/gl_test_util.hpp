#pragma once
// A QApplication shared by the viewer tests (offscreen unless DISPLAY is set) and a shown ImageView
// whose GL context works, or a reason to skip.
#include <QImage>

#include <string>

namespace gpuphot::viewers {
class ImageView;
}

namespace gpuphot::viewers::test {
void ensureApp();
// Shows view at w x h and renders once; returns "" when it has a working GL context, else why not.
std::string showAndCheckGl(ImageView& view, int w, int h);
// Renders and returns the framebuffer.
QImage grab(ImageView& view);
} // namespace gpuphot::viewers::test

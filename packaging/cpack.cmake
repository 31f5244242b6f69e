# Install rules and CPack: `cpack -G DEB` in a build directory makes two Debian packages,
# gpuphot (the CLI) and gpuphot-studio (the Qt workbench, depends on gpuphot). dpkg-shlibdeps
# (package dpkg-dev) fills in the shared-library dependencies from the binaries themselves.
include(GNUInstallDirs)
# Installing (and cpack) does not rebuild everything: the caller builds what it installs.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

install(TARGETS gpuphot RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
install(FILES README.md docs/CLI.md docs/CONFIG.md docs/FLAGS.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT cli)
install(FILES resources/demo/simulate.json DESTINATION ${CMAKE_INSTALL_DATADIR}/gpuphot COMPONENT cli)
if(TARGET gpuphot-studio)
  install(TARGETS gpuphot-studio RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT gui)
  install(FILES packaging/gpuphot-studio.desktop DESTINATION ${CMAKE_INSTALL_DATADIR}/applications COMPONENT gui)
  install(FILES resources/icons/gpuphot-studio.svg
          DESTINATION ${CMAKE_INSTALL_DATADIR}/icons/hicolor/scalable/apps COMPONENT gui)
endif()

set(CPACK_PACKAGE_NAME gpuphot)
set(CPACK_PACKAGE_VENDOR "GPUPHOT Studio")
set(CPACK_PACKAGE_CONTACT "GPUPHOT Studio developers <gpuphot@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "GPU photometry and astrometry of astronomical CCD/sCMOS frames")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/gpuphot")
set(CPACK_DEBIAN_CLI_PACKAGE_NAME gpuphot)
set(CPACK_DEBIAN_CLI_DESCRIPTION
    "GPU photometry and astrometry of astronomical frames (command line)\n gpuphot reduces FITS frames into calibrated catalogs: background, detection with\n deblending, PSF model, aperture photometry, crossmatch, zero point and WCS fit,\n on the CPU or, when built with CUDA and a device is present, on the GPU.")
set(CPACK_DEBIAN_GUI_PACKAGE_NAME gpuphot-studio)
set(CPACK_DEBIAN_GUI_PACKAGE_DEPENDS "gpuphot (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_GUI_DESCRIPTION
    "GPUPHOT Studio workbench (Qt 6)\n A live photometry workbench: OpenGL image viewer, source and PSF overlays, catalog\n table and residual plots over the same pipeline as gpuphot.")
set(CPACK_COMPONENTS_ALL cli)
if(TARGET gpuphot-studio)
  list(APPEND CPACK_COMPONENTS_ALL gui)
endif()
include(CPack)

# What `cmake --install` puts where, and the .deb CPack makes of it
# (`cmake --build build --target package`). Included from the top-level CMakeLists.txt once
# every target exists. Paths follow GNUInstallDirs under CMAKE_INSTALL_PREFIX; DESTDIR works.
#
#   bin/                     coordinatord, workerd, chorus-rank (workerd runs the chorus-rank in
#                            its own directory: wrk_proc_rank_exe), chorusctl
#   lib/                     libchorus_engine_cuda.so when CUDA was found: chorus-rank dlopens
#                            it from its own directory or ../lib/ (backend_cuda_load.c), so this
#                            is `lib`, not the multiarch LIBDIR
#   lib/systemd/system/      the units, naming the binaries under this prefix
#   share/chorus/            example configs (etc/), job files, Slurm script, Grafana dashboard
#   share/doc/chorus/        README, LICENSE, docs
#   share/bash-completion/completions/chorusctl
#   share/man/man1/chorusctl.1, man8/coordinatord.8, man8/workerd.8 (when help2man is there)
# The daemons read /etc/chorus whatever the prefix: deploy/install.sh and the package's
# postinst copy the example configs there when none exist.
include(GNUInstallDirs)

install(TARGETS coordinatord workerd chorus-rank chorusctl
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET chorus_engine_cuda)
  install(TARGETS chorus_engine_cuda LIBRARY DESTINATION lib)
endif()

set(CHORUS_SYSTEMD_UNIT_DIR "lib/systemd/system"
    CACHE STRING "Where the systemd units go, relative to the prefix (or absolute)")
foreach(unit chorus-coordinatord chorus-workerd)
  configure_file(${CMAKE_CURRENT_SOURCE_DIR}/deploy/systemd/${unit}.service.in
                 ${CMAKE_BINARY_DIR}/deploy/${unit}.service @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/deploy/${unit}.service DESTINATION ${CHORUS_SYSTEMD_UNIT_DIR})
endforeach()

set(CHORUS_SHARE ${CMAKE_INSTALL_DATADIR}/chorus)
install(FILES deploy/etc/coordinatord.conf deploy/etc/workerd.conf DESTINATION ${CHORUS_SHARE}/etc)
install(FILES deploy/jobs/demo.ini deploy/jobs/diag.ini DESTINATION ${CHORUS_SHARE}/jobs)
install(PROGRAMS deploy/slurm/chorus.sbatch DESTINATION ${CHORUS_SHARE}/slurm)
install(FILES deploy/grafana-dashboard.json DESTINATION ${CHORUS_SHARE})
install(FILES README.md LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})

# bash completion, generated from chorusctl's command table by the chorusctl just built
set(CHORUS_COMPLETION ${CMAKE_BINARY_DIR}/deploy/chorusctl.bash)
add_custom_command(OUTPUT ${CHORUS_COMPLETION}
                   COMMAND sh -c "$<TARGET_FILE:chorusctl> completion bash > ${CHORUS_COMPLETION}"
                   DEPENDS chorusctl VERBATIM)
add_custom_target(chorusctl_completion ALL DEPENDS ${CHORUS_COMPLETION})
install(FILES ${CHORUS_COMPLETION} RENAME chorusctl
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)

# Man pages from each binary's --help and --version (help2man), when help2man is installed:
# chorusctl(1), coordinatord(8), workerd(8). The text is the one --help prints, so they never
# disagree.
find_program(HELP2MAN help2man)
if(HELP2MAN)
  set(CHORUS_MAN_PAGES "")
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/man)
  foreach(spec "chorusctl;1;Chorus cluster control: submit, watch and inspect jobs"
               "coordinatord;8;Chorus cluster coordinator" "workerd;8;Chorus node agent")
    list(GET spec 0 prog)
    list(GET spec 1 sect)
    list(GET spec 2 what)
    set(page ${CMAKE_BINARY_DIR}/man/${prog}.${sect})
    add_custom_command(OUTPUT ${page}
                       COMMAND ${HELP2MAN} --no-info --section ${sect} --name ${what}
                               --output ${page} $<TARGET_FILE:${prog}>
                       DEPENDS ${prog} VERBATIM)
    list(APPEND CHORUS_MAN_PAGES ${page})
    install(FILES ${page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${sect})
  endforeach()
  add_custom_target(chorus_man ALL DEPENDS ${CHORUS_MAN_PAGES})
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME chorus)
set(CPACK_PACKAGE_VENDOR "Chorus")
set(CPACK_PACKAGE_CONTACT "Chorus maintainers <chorus@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "3D-parallel GPT-2 trainer: coordinatord, workerd, chorus-rank, chorusctl")
set(CPACK_RESOURCE_FILE_LICENSE ${CMAKE_CURRENT_SOURCE_DIR}/LICENSE)
# The package installs under the prefix the build was configured with, which the units and
# the postinst name: configure with -DCMAKE_INSTALL_PREFIX=/usr for a Debian-style package.
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/chorus")
# Library dependencies from the binaries themselves (dpkg-shlibdeps). A CUDA build links
# libraries Debian does not package (the CUDA toolkit's): name its dependencies by hand then.
if(NOT TARGET chorus_engine_cuda)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
endif()
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "ucx-utils")
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/deploy/debian/postinst.in
               ${CMAKE_BINARY_DIR}/deploy/debian/postinst @ONLY
               FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                                WORLD_READ WORLD_EXECUTE)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/deploy/debian/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)

# Sourced by the GPU scripts, from the repository root: numcheck from this checkout as an editable install. Its
# namespace maps numcheck.impls onto impls/ and so on (setup.py's package_dir), which PYTHONPATH alone cannot do.
# No dependency is installed and nothing is fetched (the device has torch, triton, pytest and setuptools, and no
# network). Installed, numcheck's pytest11 entry point loads the plugin in every pytest run: `-p numcheck.tests.plugin`
# or PYTEST_PLUGINS would register it a second time, which pytest refuses.
if ! nc_install_log=$(python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . 2>&1); then
  echo "$nc_install_log"
  echo "numcheck: the editable install of $PWD failed (see above)"
  exit 2
fi
# The wheels carried in .wheels/ (its top level: Liger-Kernel, cut-cross-entropy, allpairspy — a dependency of
# numcheck's the device lacks; subfolders hold what one script picks itself), installed --no-deps into /tmp/carried,
# which goes last on PYTHONPATH. Every script that sources this file gets them.
if ls .wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/carried .wheels/*.whl
fi
[ -d /tmp/carried ] && case ":${PYTHONPATH:-}:" in *:/tmp/carried:*) ;; *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/carried" ;; esac

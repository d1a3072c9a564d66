#!/bin/bash
# Superseded by notes/session10/gpu/run.sh (the same steps, with test
# selection and the profile and tests+bench modes). The version that
# produced run7, run14 and run21 here is in git: `git show b7a4b1e:notes/session9/gpu/run.sh`.
exec bash "$(dirname "$0")/../../session10/gpu/run.sh" "$@"

#!/usr/bin/env bash
# Runs the fuzzer on the local backend or under mpirun (what CTest and scripts/fuzz.sh call):
#   run.sh EXE [--backend local|mpi] [--np N] [fuzzer options]
#   run.sh EXE --replay FILE        (backend and ranks come from the corpus file)
set -euo pipefail
exe=$1
shift
backend=local np=3 args=()
while (($#)); do
    case $1 in
    --backend) backend=$2 args+=("$1" "$2") && shift 2 ;;
    --np) np=$2 && shift 2 ;;
    --replay)
        backend=$(sed -n 's/^backend=//p' "$2")
        np=$(sed -n 's/^ranks=//p' "$2")
        args+=("$1" "$2") && shift 2
        ;;
    *) args+=("$1") && shift ;;
    esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$backend" = mpi ]; then
    exec "${MPIEXEC:-mpirun}" --oversubscribe -np "$np" "$exe" "${args[@]}"
fi
exec "$exe" "${args[@]}"

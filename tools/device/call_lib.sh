# Shared by the focused device calls (prefill_check.sh, issue12_targets.sh); source it from the
# repository root. Sets T0 and B, unpacks the bundle gpu/bin.tar.xz into $B, links the source path
# compiled into the test binaries to this checkout, prints the bundle's commit and the card.
#   left: seconds left of BUDGET (default 570);  to S: S, or what is left if less (at least 5)
T0=$(date +%s)
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - T0) )); }
to() { local l=$(left); (( l < 5 )) && l=5; (( $1 < l )) && echo $1 || echo $l; }
B=/tmp/qflash_session_bin
rm -rf $B && mkdir -p $B && tar -C $B --strip-components=1 -xJf gpu/bin.tar.xz || exit 2
S=$(cat $B/SOURCE_DIR); [[ -n "$S" && ! -e "$S" ]] && mkdir -p "$(dirname "$S")" && ln -s "$PWD" "$S"
echo "bundle $(cat $B/COMMIT)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

"""Scratch: a timing-only variant (wrong numbers): each layer's conv, scan and attention run for the round's first
window only, as a bound on what one launch for all streams could save.  python3 make_noperstream.py VARIANT_DIR"""
import sys
p = f"{sys.argv[1]}/tensorfold/model/qwen35.py"
s = open(p).read()
old_conv = """                with lanes.lane(n):
                    tails.append(ops.causal_conv("""
new_conv = """                if n > 0:
                    tails.append(win.state.conv_tail[i])
                    continue
                with lanes.lane(n):
                    tails.append(ops.causal_conv("""
assert old_conv in s
s = s.replace(old_conv, new_conv)
old_scan = """                state, maps = win.state, win.maps
                with lanes.lane(n):
                    start = state.scan_start(i)"""
new_scan = """                state, maps = win.state, win.maps
                if n > 0:
                    state.records[i] = DeltaNetRecord(state.recurrent[i], state.recurrent[i], None, mixed[a:b],
                                                      state.conv_tail[i], state.conv_tail[i])
                    continue
                with lanes.lane(n):
                    start = state.scan_start(i)"""
assert old_scan in s
s = s.replace(old_scan, new_scan)
old_att = """                with lanes.lane(n):
                    self._attend("""
new_att = """                if n > 0:
                    continue
                with lanes.lane(n):
                    self._attend("""
assert old_att in s
s = s.replace(old_att, new_att)
open(p, "w").write(s)

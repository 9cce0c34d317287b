#!/usr/bin/env python3
"""Function lengths in the workspace's production code, for issue-style reviews of the
code's shape (ARCHITECTURE.md, "Rules the compiler keeps", the line after them).

The rule: a function's length is its lines from the `fn` line to its closing brace;
`#[cfg(test)]` and `#[test]` items are left out, and only `crates/*/src` is read (tests/
and benches/ are not). The demo (`crates/server/src/demo`) counts apart from the
service. Usage: scripts/fn-lengths.py [REPOSITORY_ROOT]"""
import re, sys, pathlib, collections, signal

# Cut off by `head`: stop quietly.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?((const|async|unsafe|extern "C")\s+)*fn\s+(\w+)')

def strip(line, state):
    """Removes strings, chars and comments from a line; state carries block comments and raw strings."""
    out = []; i = 0; n = len(line)
    while i < n:
        if state['block']:
            j = line.find('*/', i)
            if j < 0: return ''.join(out)
            state['block'] = False; i = j + 2; continue
        if state['raw'] is not None:
            end = '"' + '#' * state['raw']
            j = line.find(end, i)
            if j < 0: return ''.join(out)
            state['raw'] = None; i = j + len(end); continue
        if state['str']:
            j = i
            while j < n and line[j] != '"':
                j += 2 if line[j] == '\\' else 1
            if j >= n: return ''.join(out)
            state['str'] = False; i = j + 1; continue
        c = line[i]
        if line.startswith('//', i): break
        if line.startswith('/*', i): state['block'] = True; i += 2; continue
        m = re.match(r'b?r(#*)"', line[i:])
        if m and (i == 0 or not (line[i-1].isalnum() or line[i-1] == '_')):
            state['raw'] = len(m.group(1)); i += m.end(); continue
        if c == '"': state['str'] = True; i += 1; continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", line[i:])
            if m: i += m.end(); continue
        out.append(c); i += 1
    return ''.join(out)

def functions(path):
    lines = path.read_text().splitlines()
    state = {'block': False, 'raw': None, 'str': False}
    code = [strip(l, state) for l in lines]
    skip_until = -1; test_attr = False; res = []
    i = 0
    while i < len(code):
        l = code[i]
        if i <= skip_until: i += 1; continue
        if re.search(r'#\[cfg\(test\)\]', lines[i]) or re.search(r'#\[(tokio::)?test\b', lines[i]):
            test_attr = True; i += 1; continue
        m = FN.match(l)
        opens_item = m or re.match(r'^\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{', l) or re.match(r'^\s*impl\b', l)
        if m or (test_attr and opens_item):
            # find body end
            depth = 0; started = False; j = i
            while j < len(code):
                for ch in code[j]:
                    if ch == '{': depth += 1; started = True
                    elif ch == '}': depth -= 1
                    elif ch == ';' and not started and depth == 0:
                        started = None; break
                if started is None: break
                if started and depth == 0: break
                j += 1
            if started is None:
                i += 1; test_attr = False; continue
            if test_attr:
                skip_until = j
            elif m:
                res.append((m.group(5), i + 1, j - i + 1))
            test_attr = False
            i += 1; continue
        if l.strip() and not l.strip().startswith('#'):
            test_attr = False
        i += 1
    return res

def crate_of(p):
    parts = p.parts
    at = parts.index('crates')
    if parts[at + 1:at + 4] == ('server', 'src', 'demo'):
        return 'demo'
    return parts[at + 1]

roots = [pathlib.Path(a) for a in sys.argv[1:]] or [pathlib.Path('.')]
rows = []
for root in roots:
    for p in sorted((root / 'crates').glob('*/src/**/*.rs')):
        for name, line, n in functions(p):
            rows.append((n, crate_of(p), str(p.relative_to(root)), line, name))
rows.sort(reverse=True)
SERVICE = {'core', 'app', 'api', 'mysql', 'redis', 'nats', 'server'}
per = collections.defaultdict(lambda: [0, 0, 0])
for n, c, *_ in rows:
    per[c][0] += 1; per[c][1] += n > 70; per[c][2] += n > 100
print('crate        fns  >70 >100')
for c in sorted(per):
    print(f'{c:<12}{per[c][0]:>5}{per[c][1]:>5}{per[c][2]:>5}')
s = [r for r in rows if r[1] in SERVICE]
print(f'service crates: {sum(r[0] > 70 for r in s)} over 70, {sum(r[0] > 100 for r in s)} over 100')
o = [r for r in rows if r[1] not in SERVICE]
print(f'bench, sim, demo and the rest: {sum(r[0] > 150 for r in o)} over 150')
print('longest (over 70):')
for n, c, p, line, name in rows:
    if n <= 70:
        break
    print(f'{n:>5}  {p}:{line}  {name}')

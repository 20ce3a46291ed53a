"""Writes crafted tar archives for bench/tmpfs-untar/run: OUT NAME HOSTDIR."""
import tarfile, io, sys, os
def mk(path, members, fmt=tarfile.GNU_FORMAT):
    with tarfile.open(path, 'w', format=fmt) as t:
        for m, data in members:
            m.uname = m.gname = ''
            t.addfile(m, io.BytesIO(data) if data is not None else None)
def f(name, data=b'x'):
    i = tarfile.TarInfo(name); i.size = len(data); i.mode = 0o644; return (i, data)
def l(name, target, kind=tarfile.SYMTYPE):
    i = tarfile.TarInfo(name); i.type = kind; i.linkname = target; return (i, None)
def d(name):
    i = tarfile.TarInfo(name); i.type = tarfile.DIRTYPE; i.mode = 0o755; return (i, None)
out = sys.argv[1]; o = sys.argv[2]; host = sys.argv[3]
cases = {
 'dotdot': [f('../' + o)],
 'dotdot2': [d('a'), f('a/../../' + o)],
 'abs': [f(host + '/' + o)],
 'through': [l('a', host), f('a/' + o)],
 'through-dir': [l('a', host), d('a/' + o)],
 'through-link': [l('a', host), f('t'), l('a/' + o, 't', tarfile.LNKTYPE)],
 'hardlink-out': [l(o, '../../etc/passwd', tarfile.LNKTYPE)],
 'dev': [(lambda i: (setattr(i, 'type', tarfile.CHRTYPE), setattr(i, 'devmajor', 1), setattr(i, 'devminor', 3), (i, None))[-1])(tarfile.TarInfo('null'))],
 'uname': [f('u')],
 'hardlink-dir': [d('dd'), l(o, 'dd', tarfile.LNKTYPE)],
 'through-hardlinked-symlink': [l('a', host), l('h', 'a', tarfile.LNKTYPE), f('h/' + o)],
 'longname-through': [l('a', host), f('a/' + 'n' * 150)],
 'symlink-then-dir': [l('a', host), d('a'), f('a/' + o)],
 'ok': [d('.'), d('x'), f('x/y', b'hello'), l('x/s', 'y'), l('x/h', 'x/y', tarfile.LNKTYPE)],
}
for k, m in cases.items():
    mk(os.path.join(out, k + '.tar'), m)
# pax: an extended header ('x')
with tarfile.open(os.path.join(out, 'pax.tar'), 'w', format=tarfile.PAX_FORMAT) as t:
    i = tarfile.TarInfo('p'); i.pax_headers = {'comment': 'x'}; t.addfile(i, io.BytesIO(b''))
# uname set
with tarfile.open(os.path.join(out, 'uname.tar'), 'w', format=tarfile.GNU_FORMAT) as t:
    i = tarfile.TarInfo('u'); i.uname = 'root'; t.addfile(i, io.BytesIO(b''))
# bad checksum: flip a byte of the name in ok.tar
b = bytearray(open(os.path.join(out, 'ok.tar'), 'rb').read()); b[512+1] ^= 1
open(os.path.join(out, 'badsum.tar'), 'wb').write(b)
# truncated: ok.tar without its end blocks and half a file
b = open(os.path.join(out, 'ok.tar'), 'rb').read(); open(os.path.join(out, 'trunc.tar'), 'wb').write(b[:512*3+100])

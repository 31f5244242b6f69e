#!/usr/bin/python3
"""What a per-source curve of growth would give on a varying-PSF field: the 3 px aperture flux corrected with
(a) the catalog's field-wide APCOR2 and (b) a circular Moffat curve of growth at the catalog's own `fwhm`
(the PSF model at the source; beta from --beta), with the sky-annulus wing term the pipeline applies
(annulus 4-6 x the field FWHM). Binned by the true local FWHM. usage: local_cog_probe.py FIELD OUT [beta=3]"""
import json, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import evaluate as ev
from astropy.io import fits
field, out = sys.argv[1], sys.argv[2]
beta = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
t = ev.load_truth(field)
h = fits.open(out + '/FRAME.cat.fits')[1]
cat, hdr = h.data, h.header
tid = {int(v): i for i, v in enumerate(t['id'])}
rid = np.asarray(cat['ref_id'])
k = np.nonzero(rid >= 0)[0]
i = np.array([tid[int(v)] for v in rid[k]])
f3 = np.asarray(cat['flux_aper_2'], float)[k]
snr = f3 / np.asarray(cat['fluxerr_aper_2'], float)[k]
flags = np.asarray(cat['flags'])[k]
fw = np.asarray(cat['fwhm'], float)[k]
fmed = hdr['FWHM']


def ee(r, fwhm):
    a = fwhm / (2 * np.sqrt(2 ** (1 / beta) - 1))
    return 1 - (1 + (r / a) ** 2) ** (1 - beta)


a1, a2 = 4 * fmed, 6 * fmed
g = ee(3.0, fw) - 9.0 / (a2 ** 2 - a1 ** 2) * (ee(a2, fw) - ee(a1, fw))
m_true = -2.5 * np.log10(t['flux'][i])
d_global = -2.5 * np.log10(f3) + hdr['APCOR2'] - m_true
d_local = -2.5 * np.log10(f3 / g) - m_true
s = (snr > 100) & ((flags & (1 | 2 | 4 | 8 | 16 | 64 | 256)) == 0)
tf = t['fwhm'][i]
print('3 px aperture, S/N > 100, unflagged: inst - true')
for lo, hi in [(2.5, 2.7), (2.7, 2.9), (2.9, 3.1), (3.1, 3.3), (3.3, 3.6)]:
    q = s & (tf >= lo) & (tf < hi)
    print('  FWHM %.1f-%.1f  n %4d   field-wide APCOR2 %+.4f   local Moffat cog %+.4f' % (
        lo, hi, q.sum(), np.median(d_global[q]), np.median(d_local[q])))
print('  all: robust sigma field-wide %.4f, local %.4f' % (ev.robust_sigma(d_global[s]), ev.robust_sigma(d_local[s])))

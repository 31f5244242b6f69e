#!/usr/bin/python3
"""flux_opt (or flux_psf: third argument psf) minus truth binned by the local true FWHM (varying-PSF fields).
usage: fwhm_probe.py FIELD OUT [opt|psf]"""
import sys, json, numpy as np
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__import__('os').path.abspath(__file__)), '..'))
import evaluate as ev
from astropy.io import fits
field,out=sys.argv[1],sys.argv[2]
t=ev.load_truth(field); cat=fits.open(out+'/FRAME.cat.fits')[1].data; rep=json.load(open(out+'/FRAME.report.json'))
tid={int(v):i for i,v in enumerate(t['id'])}; rid=np.asarray(cat['ref_id'])
m=rid>=0; k=np.nonzero(m)[0]; i=np.array([tid[int(v)] for v in rid[m]])
col=sys.argv[3] if len(sys.argv)>3 else "opt"; fo=np.asarray(cat["flux_"+col],float)[k]; snr=fo/np.asarray(cat["fluxerr_"+col],float)[k]
flags=np.asarray(cat['flags'])[k]
dm=-2.5*np.log10(fo)-(-2.5*np.log10(t['flux'][i]))
fw=t['fwhm'][i]
print('zp-true %+.4f'%(rep['zp']-25.0))
for lo,hi,name in [(20,100,'S/N 20-100'),(100,1e9,'S/N>100')]:
  s=(snr>lo)&(snr<hi)&((flags&(1|2|4|8|16|64|256))==0)
  print(name)
  for a,b in [(2.5,2.7),(2.7,2.9),(2.9,3.1),(3.1,3.3),(3.3,3.6)]:
    q=s&(fw>=a)&(fw<b)
    print('  FWHM %.1f-%.1f: n %4d median inst-true %+.4f'%(a,b,q.sum(),np.median(dm[q])))

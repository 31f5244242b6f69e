#!/usr/bin/python3
"""Concentration f(3 px)/f(12 px) of the top-N-by-S/N candidates against the single-star model value: how a clip
about the median (the pipeline's) and one about the PSF model's value select. Needs the 12 px aperture and
MODEL.fits. usage: conc_probe.py FIELD OUT NMAX"""
import sys, json, numpy as np
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__import__('os').path.abspath(__file__)), '..'))
import evaluate as ev
from astropy.io import fits
field,out=sys.argv[1],sys.argv[2]; NMAX=int(sys.argv[3])
meta=json.load(open(field+'/FIELD.json')); t=ev.load_truth(field); cat=fits.open(out+'/FRAME.cat.fits')[1].data
model=fits.getdata(field+'/MODEL.fits').astype(float)
f=np.asarray(cat['flags']); reject=1|2|4|8|16|32|64|256|1024
f12=np.asarray(cat['flux_aper_5'],float); e12=np.asarray(cat['fluxerr_aper_5'],float)
f3=np.asarray(cat['flux_aper_2'],float); e3=np.asarray(cat['fluxerr_aper_2'],float)
ok=((f&reject)==0)&(f3/e3>=50)&(f12/e12>=50)
idx=np.nonzero(ok)[0]; order=idx[np.argsort(-(f12/e12)[idx])]
tid={int(v):i for i,v in enumerate(t['id'])}; rid=np.asarray(cat['ref_id'])
def nl(k):
    i=tid[int(rid[k])]; own=ev.own_ee(t,i,meta,[12.0])[0]*t['flux'][i]; return (ev.model_sum(model,t['x'][i]-1,t['y'][i]-1,12.0)-own)/own
# the model concentration for a single star (truth PSF at the centre FWHM 3): own_ee 3/12 of a star
i0=tid[int(rid[order[0]])]; ee=ev.own_ee(t,i0,meta,[3.0,12.0]); cm=ee[0]/ee[1]
print('model concentration f(3)/f(12) = %.4f'%cm)
for name,sel in [('top %d by S/N'%NMAX, order[:NMAX]), ('top 1000 by S/N', order[:1000])]:
    conc=f3[sel]/f12[sel]; med=np.median(conc)
    sig=1.4826*np.median(abs(conc-med))
    n=np.array([nl(k) for k in sel[:300]])
    c=conc[:300]
    keep_med=abs(c-med)<=3*sig
    # clip about the model with the noise scale of bright singles: sigma from the conc errors ~ relative flux errors
    s_noise=np.median(np.hypot(e3[sel]/f3[sel],e12[sel]/f12[sel]))*cm
    keep_mod=abs(c-cm)<=3*max(s_noise,0.002)
    print('%s: median conc %.4f (model %.4f), MAD-sigma %.4f; kept by the median clip: %d/%d with median neighbour light %.4f; kept by a clip about the model (+-%.4f): %d with median neighbour light %.4f, median conc %.4f'%(
        name,med,cm,sig,keep_med.sum(),len(c),np.median(n[keep_med]),3*max(s_noise,0.002),keep_mod.sum(),np.median(n[keep_mod]),np.median(c[keep_mod])))
    print('   correlation of concentration deficit with neighbour light: %.2f'%np.corrcoef(cm-c,n)[0,1])

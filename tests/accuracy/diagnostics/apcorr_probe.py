#!/usr/bin/python3
"""Aperture-correction stars: reconstructs the curve-of-growth star selection from the catalog (needs a 12 px =
4 FWHM aperture: --config with aperture.radii [2,3,4,6,12]) and measures, with MODEL.fits, the light of other stars
inside their reference aperture. usage: apcorr_probe.py FIELD OUT [NMAX=100]"""
import sys, json, numpy as np
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__import__('os').path.abspath(__file__)), '..'))
import evaluate as ev
from astropy.io import fits
field, out = sys.argv[1], sys.argv[2]
meta=json.load(open(field+'/FIELD.json')); t=ev.load_truth(field)
cat=fits.open(out+'/FRAME.cat.fits')[1].data
rep=json.load(open(out+'/FRAME.report.json'))
print('apcorr', rep['aperture'])
f=np.asarray(cat['flags']); reject=1|2|4|8|16|32|64|256|1024
f12=np.asarray(cat['flux_aper_5'],float); e12=np.asarray(cat['fluxerr_aper_5'],float)
f3=np.asarray(cat['flux_aper_2'],float); e3=np.asarray(cat['fluxerr_aper_2'],float)
f2=np.asarray(cat['flux_aper_1'],float)
ok=((f&reject)==0)&(f3/e3>=50)&(f12/e12>=50)
idx=np.nonzero(ok)[0]; NMAX=int(sys.argv[3]) if len(sys.argv)>3 else 100; idx=idx[np.argsort(-(f12/e12)[idx])][:NMAX]
conc=f3[idx]/f12[idx]; med=np.median(conc); sig=1.4826*np.median(abs(conc-med))
idx=idx[abs(conc-med)<=3*sig]
print('reconstructed apcorr stars', len(idx), 'median f2/f12', np.median(f2[idx]/f12[idx]), '-> mag', 2.5*np.log10(np.median(f2[idx]/f12[idx])))
# truth match via ref_id
tid={int(v):i for i,v in enumerate(t['id'])}
rid=np.asarray(cat['ref_id'])
model=fits.getdata(field+'/MODEL.fits').astype(float)
rows=[]
for k in idx:
    i=tid.get(int(rid[k]),-1)
    if i<0: continue
    x0,y0=t['x'][i]-1,t['y'][i]-1
    own2,own12=ev.own_ee(t,i,meta,[2.0,12.0])*t['flux'][i]
    tot2=ev.model_sum(model,x0,y0,2.0); tot12=ev.model_sum(model,x0,y0,12.0)
    dx=cat['x'][k]-t['x'][i]; dy=cat['y'][k]-t['y'][i]
    rows.append((t['flux'][i], f12[k]/t['flux'][i], f2[k]/f12[k], own2/own12, tot2/tot12, (tot12-own12)/own12, np.hypot(dx,dy), cat['sky'][k]-meta['sky']))
r=np.array(rows)
print('columns: Ftrue, f12/Ftrue, f2/f12 meas, own2/own12 truth, model2/model12 (incl. neighbours), neighbour light in 12px / own, centroid err, sky err')
np.set_printoptions(precision=4, suppress=True, linewidth=200)
print('medians', np.median(r,axis=0))
print(r[np.argsort(r[:,5])][::10])
# neighbours of the apcorr stars: truth stars within 12 px with >1% flux, and whether a detection lies within 1.5 px of them
GI=ev.grid_index(t['x'],t['y'],16.0); DI=ev.grid_index(np.asarray(cat['x'],float),np.asarray(cat['y'],float),4.0)
cx=np.asarray(cat['x'],float); cy=np.asarray(cat['y'],float)
nn=[];
for k in idx:
    i=tid.get(int(rid[k]),-1)
    nb,d=ev.neighbours(GI,t['x'],t['y'],t['x'][i],t['y'][i],12.0)
    for j,dj in zip(nb,d):
        if j==i or t['flux'][j]<0.01*t['flux'][i]: continue
        dn,dd=ev.neighbours(DI,cx,cy,t['x'][j],t['y'][j],1.5)
        nn.append((dj, t['flux'][j]/t['flux'][i], len(dn)))
nn=np.array(nn)
print('neighbours >1%% within 12 px of the apcorr stars: %d; with a detection within 1.5 px: %d' % (len(nn), (nn[:,2]>0).sum()))
print(nn[np.argsort(nn[:,0])][::3])

#!/usr/bin/python3
"""Local sky error against the true sky and the true light of other stars in the aperture and the annulus (MODEL.fits),
for calibrators in S/N bins. usage: sky_probe.py FIELD OUT"""
import sys, json, numpy as np, math
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__import__('os').path.abspath(__file__)), '..'))
import evaluate as ev
from astropy.io import fits
field,out=sys.argv[1],sys.argv[2]
meta=json.load(open(field+'/FIELD.json'))
t=ev.load_truth(field); cat=fits.open(out+'/FRAME.cat.fits')[1].data
model=fits.getdata(field+'/MODEL.fits').astype(float)
tid={int(v):i for i,v in enumerate(t['id'])}; rid=np.asarray(cat['ref_id'])
k=np.nonzero(rid>=0)[0]; i=np.array([tid[int(v)] for v in rid[k]])
fo=np.asarray(cat['flux_opt'],float)[k]; snr=fo/np.asarray(cat['fluxerr_opt'],float)[k]
flags=np.asarray(cat['flags'])[k]; cal=(flags&4096)!=0
dsky=np.asarray(cat['sky'])[k]-meta['sky']
f3=np.asarray(cat['flux_aper_2'],float)[k]
rng=np.random.default_rng(0)
for a,b in [(20,30),(50,100),(300,1e9)]:
  sel=np.nonzero(cal&(snr>=a)&(snr<b))[0]; sel=rng.choice(sel,min(150,len(sel)),replace=False)
  cap=[];cann=[];ds=[];err3=[]
  for s in sel:
    ii=i[s]; x0,y0=t['x'][ii]-1,t['y'][ii]-1
    own3=ev.own_ee(t,ii,meta,[3.0])[0]*t['flux'][ii]
    tot3=ev.model_sum(model,x0,y0,3.0)
    if not np.isfinite(tot3): continue
    cap.append((tot3-own3)/(math.pi*9))
    # annulus 12-18 px mean of model (all stars incl. own wing), no masking
    ix,iy=int(round(x0)),int(round(y0)); Y,X=np.mgrid[iy-18:iy+19,ix-18:ix+19]
    if iy-18<0 or ix-18<0 or iy+19>model.shape[0] or ix+19>model.shape[1]: cap.pop(); continue
    d=np.hypot(X-x0,Y-y0); m=(d>=12)&(d<=18)
    cann.append(np.median(model[iy-18:iy+19,ix-18:ix+19][m]))
    ds.append(dsky[s])
    err3.append((f3[s]-own3)/own3)
  cap,cann,ds,err3=map(np.array,(cap,cann,ds,err3))
  print('S/N %g-%g: n %d  sky err (meas-true) median %+.2f ADU | true contamination in r=3 aperture: median %.2f mean %.2f ADU/px | annulus median model light %.2f | flux_aper(3px) rel err median %+.4f'%(a,b,len(ds),np.median(ds),np.median(cap),np.mean(cap),np.median(cann),np.median(err3)))

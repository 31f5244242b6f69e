#!/usr/bin/python3
"""BJD_TDB and HJD_UTC from astropy, the independent reference for core/series/barycentric.

Writes CSV (mjd_utc, ra, dec, lat, lon, elev, jd_tdb, bjd_tdb, hjd_utc) to stdout for a fixed set of times,
targets and sites: Time(mjd, scale='utc', location=site).tdb + light_travel_time(target, 'barycentric'),
and .utc + light_travel_time(target, 'heliocentric'). Offline: the bundled IERS-B table only (dates
inside it), astropy's builtin ephemeris (ERFA's epv00), so the figures can be regenerated anywhere.
"""
import sys
import warnings

import numpy as np
from astropy import units as u
from astropy.coordinates import EarthLocation, SkyCoord
from astropy.time import Time
from astropy.utils import iers

iers.conf.auto_download = False
warnings.simplefilter("ignore")

sites = [(-30.24, -70.74, 2200.0), (19.8207, -155.468, 4205.0), (52.2, 0.12, 20.0), (0.0, 0.0, 0.0)]
targets = [(150.0, 20.0), (0.5, -89.0), (279.23, 38.78), (83.82, -5.39), (201.3, -11.16)]
mjds = [57023.25, 57400.0312, 57754.5, 58119.9, 58500.123456, 58849.77, 59215.0001]

out = sys.stdout
out.write("mjd_utc,ra,dec,lat,lon,elev,jd_tdb,bjd_tdb,hjd_utc\n")
for k, mjd in enumerate(mjds):
    for j, (ra, dec) in enumerate(targets):
        lat, lon, elev = sites[(k + j) % len(sites)]
        loc = EarthLocation.from_geodetic(lon * u.deg, lat * u.deg, elev * u.m)
        t = Time(mjd, format="mjd", scale="utc", location=loc)
        c = SkyCoord(ra * u.deg, dec * u.deg, frame="icrs")
        bjd = t.tdb + t.light_travel_time(c, "barycentric")
        hjd = t.utc + t.light_travel_time(c, "heliocentric")
        out.write("%.6f,%.4f,%.4f,%.4f,%.4f,%.1f,%.10f,%.10f,%.10f\n"
                  % (mjd, ra, dec, lat, lon, elev, t.tdb.jd, bjd.tdb.jd, hjd.utc.jd))
